"""Kubernetes forms of the recipes: rendered from the JobSpec, validated offline against the real schemas.

No API server exists here: validation is the boundary (kubernetes-validate's OpenAPI schemas, kubeflow-training's
models, the MPI Operator's v2beta1 API), and a worker's argv is checked by running the container's own command
line in bash with the variables torchrun gives each worker.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess

import pytest
import yaml

from tests.conftest import REPO, run_hpc
from toolkit.cluster.queues import load_queues
from toolkit.job.rank import RankVar, preview_argv
from toolkit.job.spec import TORCHRUN_ENV, build_job_spec
from toolkit.k8s.manifests import EFA, GPU, HUGEPAGES, Storage, render
from toolkit.k8s.validate import validate_text
from toolkit.recipes.load import load_recipe

SETUPS = [("resnet50", "p4d.24xlarge", 3, "PyTorchJob"), ("roberta", "p5.48xlarge", 8, "PyTorchJob"),
          ("nccl-tests", "p4d.24xlarge", 2, "MPIJob")]


def _render(name, itype, nodes, **kw):
    return render(load_recipe(name), itype, nodes, storage=Storage(storage_class="fsx-lustre"), image="img:1", **kw)


def _job(rendered) -> dict:
    return rendered.documents[-1]


def _worker_pod(job: dict) -> dict:
    replicas = "pytorchReplicaSpecs" if job["kind"] == "PyTorchJob" else "mpiReplicaSpecs"
    return job["spec"][replicas]["Worker"]["template"]["spec"]


def _errors(text: str) -> list[dict]:
    return [f for f in validate_text(text)["findings"] if f["level"] == "error"]


@pytest.mark.parametrize("name,itype,nodes,kind", SETUPS)
def test_the_published_setups_render_and_pass_offline_validation(name, itype, nodes, kind):
    rendered = _render(name, itype, nodes)
    report = validate_text(rendered.text)
    assert report["valid"], report["findings"]
    assert [d["kind"] for d in rendered.documents] == ["StorageClass", "PersistentVolumeClaim", kind]
    job, it = _job(rendered), rendered.spec
    pod = _worker_pod(job)
    limits = pod["containers"][0]["resources"]["limits"]
    efa = {"p4d.24xlarge": 4, "p5.48xlarge": 32}[itype]
    assert limits == {GPU: 8, EFA: efa, HUGEPAGES: "5120Mi"}
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": itype}
    if kind == "PyTorchJob":
        assert job["spec"]["nprocPerNode"] == "8"
        assert job["spec"]["elasticPolicy"] == {"rdzvBackend": "c10d", "minReplicas": nodes, "maxReplicas": nodes,
                                                "maxRestarts": 3}
        assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == nodes
    else:
        assert job["spec"]["slotsPerWorker"] == 8
        launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
        assert launcher["args"][:6] == ["--allow-run-as-root", "-np", str(nodes * 8), "--map-by", "ppr:8:node",
                                        "--bind-to"]
        assert launcher["args"][-len(it.command):] == list(it.command)
    # requests leave room for the node's daemons; /dev/shm is memory-backed and sized for data loaders
    requests = pod["containers"][0]["resources"]["requests"]
    assert 0 < int(requests["cpu"]) < {"p4d.24xlarge": 96, "p5.48xlarge": 192}[itype]
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]
    assert shm["medium"] == "Memory" and int(shm["sizeLimit"][:-2]) >= 64
    claim = next(v for v in pod["volumes"] if v["name"] == "fsx")["persistentVolumeClaim"]["claimName"]
    assert rendered.documents[1]["metadata"]["name"] == claim
    assert rendered.documents[1]["spec"]["accessModes"] == ["ReadWriteMany"]
    assert rendered.documents[0]["provisioner"] == "fsx.csi.aws.com"


def test_efa_devices_are_all_of_the_instances_and_the_environment_is_the_slurm_one():
    p3dn = _render("resnet50", "p3dn.24xlarge", 2)
    assert _worker_pod(_job(p3dn))["containers"][0]["resources"]["limits"][EFA] == 1
    tcp = _render("resnet50", "p4d.24xlarge", 2, efa=False)
    limits = _worker_pod(_job(tcp))["containers"][0]["resources"]["limits"]
    assert EFA not in limits and HUGEPAGES not in limits
    env = {e["name"]: e["value"] for e in _worker_pod(_job(tcp))["containers"][0]["env"]}
    assert env == {**tcp.spec.environ, **dict(TORCHRUN_ENV), "OMP_NUM_THREADS": "10"}
    assert env["NCCL_SOCKET_NTHREADS"] == "4"  # TCP set


@pytest.mark.parametrize("name,itype,nodes,kind", SETUPS)
def test_planted_faults_are_caught_at_their_paths(name, itype, nodes, kind):
    docs = _render(name, itype, nodes).documents
    replicas = "pytorchReplicaSpecs" if kind == "PyTorchJob" else "mpiReplicaSpecs"
    pod = f"spec.{replicas}.Worker.template.spec"
    job_doc = f"document 3 ({kind}/{name})"

    def caught(mutate) -> list[tuple[str, str]]:
        planted = copy.deepcopy(docs)
        mutate(planted)
        return [(f["path"], f["fix"]) for f in _errors(yaml.safe_dump_all(planted))]

    wrong = {"PyTorchJob": "kubeflow.org/v2", "MPIJob": "kubeflow.org/v1"}[kind]
    assert caught(lambda d: d[2].update(apiVersion=wrong)) == [
        (f"{job_doc}: apiVersion", f"set apiVersion: {docs[2]['apiVersion']}")]
    assert caught(lambda d: d[1].update(apiVersion="v2")) == [
        ("document 2 (PersistentVolumeClaim/fsx-claim): apiVersion", "set apiVersion: v1")]

    def p3dn(d):
        d[2]["spec"][replicas]["Worker"]["template"]["spec"]["nodeSelector"]["node.kubernetes.io/instance-type"] = \
            "p3dn.24xlarge"
    assert caught(p3dn) == [(f'{job_doc}: {pod}.containers[0].resources.limits["vpc.amazonaws.com/efa"]',
                             "request 1")]  # 4 (p4d) or 32 (p5) EFA devices on a p3dn, which has 1

    def rwo(d):
        d[1]["spec"]["accessModes"] = ["ReadWriteOnce"]
    assert caught(rwo) == [("document 2 (PersistentVolumeClaim/fsx-claim): spec.accessModes",
                            "use accessModes: [ReadWriteMany] (FSx for Lustre through fsx.csi.aws.com supports it)")]

    def ranks(d):
        if kind == "PyTorchJob":
            d[2]["spec"]["nprocPerNode"] = "4"
        else:
            d[2]["spec"]["slotsPerWorker"] = 4
    key = "spec.nprocPerNode" if kind == "PyTorchJob" else "spec.slotsPerWorker"
    [(path, fix)] = caught(ranks)
    assert path == f"{job_doc}: {key}" and "8" in fix

    def typo(d):
        d[2]["spec"][replicas]["Worker"]["template"]["spec"]["containers"][0]["comand"] = ["x"]
    [(path, fix)] = caught(typo)
    assert path == f"{job_doc}: {pod}.containers[0]" and fix.startswith("remove the key")


def test_kubeflow_schema_comes_from_the_operators_models():
    """A required field of the Training Operator's PyTorchJobSpec model, and a wrong type deep in its policy."""
    job = _job(_render("resnet50", "p4d.24xlarge", 3))
    del job["spec"]["runPolicy"]
    job["spec"]["elasticPolicy"]["maxRestarts"] = "three"
    found = {(f["path"], f["message"]) for f in _errors(yaml.safe_dump(job))}
    assert found == {("document 1 (PyTorchJob/resnet50): spec", "'runPolicy' is a required property"),
                     ("document 1 (PyTorchJob/resnet50): spec.elasticPolicy.maxRestarts",
                      "'three' is not of type 'integer'")}


def test_core_kinds_are_checked_against_the_kubernetes_schemas():
    docs = _render("roberta", "p5.48xlarge", 8).documents
    docs[0]["parameters"]["perUnitStorageThroughput"] = 250  # StorageClass parameters are strings
    docs[1]["spec"]["accessModes"] = "ReadWriteMany"  # a list
    docs[1]["metadata"]["lables"] = {}
    found = [(f["path"], f["fix"]) for f in _errors(yaml.safe_dump_all(docs))]
    assert found == [
        ("document 1 (StorageClass/fsx-lustre): parameters.perUnitStorageThroughput",
         "give a value of the type the schema expects"),
        ("document 2 (PersistentVolumeClaim/fsx-claim): metadata",
         "remove the key, or fix its spelling or indentation (see the kind's API reference)"),
        ("document 2 (PersistentVolumeClaim/fsx-claim): spec.accessModes", "give a value of the type the schema expects"),
    ]


def test_validate_cli_names_document_path_and_fix(tmp_path):
    docs = _render("resnet50", "p4d.24xlarge", 3).documents
    docs[1]["spec"]["accessModes"] = ["ReadWriteOnce"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump_all(docs))
    res = run_hpc("k8s", "validate", str(bad))
    assert res.returncode == 1, res.stderr
    assert "INVALID" in res.stdout and "document 2 (PersistentVolumeClaim/fsx-claim): spec.accessModes" in res.stdout
    assert "fix: use accessModes: [ReadWriteMany]" in res.stdout
    res = run_hpc("k8s", "validate", str(bad), "--json")
    assert res.returncode == 1 and json.loads(res.stdout)["valid"] is False
    bad.write_text("kind: [unclosed\n")
    res = run_hpc("k8s", "validate", str(bad))
    assert res.returncode == 1 and "not valid YAML" in res.stdout and "Traceback" not in res.stderr


@pytest.mark.parametrize("args,message", [
    (["nccl-tests", "--nodes", "2", "--instance", "m5.xlarge"], "runs on GPUs only; m5.xlarge has no GPUs"),
    (["resnet50", "--nodes", "2", "--instance", "p3.16xlarge", "--efa"], "p3.16xlarge has no EFA devices"),
    (["nccl-tests", "--nodes", "2", "--instance", "p4d.24xlarge", "--set", "launcher.mpi=null"],
     "launcher kind binary without `mpi` has no Kubernetes form"),
    (["roberta", "--nodes", "2", "--instance", "p4d.24xlarge", "--profile", "smoke"], "has no Kubernetes form"),
    (["resnet50", "--nodes", "2", "--instance", "p9.huge"], "instance type 'p9.huge' is not in the toolkit's catalog"),
    (["roberta", "--nodes", "2", "--instance", "p4d.24xlarge", "--profile", "smoke", "--set", "prepare=null"],
     "but the pods see only the FSx volume at /fsx"),
])
def test_bad_input_gets_one_clear_error(args, message):
    res = run_hpc("k8s", "render", *args)
    assert res.returncode == 1 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and message in lines[0], res.stderr
    assert lines[1].startswith("  fix: ") and len(lines) == 2


def test_rendering_is_byte_stable_across_processes(tmp_path):
    outputs = []
    for i in range(2):
        out = tmp_path / f"r{i}.yaml"
        res = run_hpc("k8s", "render", "roberta", "--nodes", "8", "--instance", "p5.48xlarge", "-o", str(out))
        assert res.returncode == 0, res.stderr
        outputs.append(out.read_text().replace(str(out), "OUT"))
    assert outputs[0] == outputs[1]


def test_slurm_and_kubernetes_forms_agree_on_argv_and_derived_values(tmp_path):
    """roberta on 8 x p3dn: the Slurm queue of jobs/p3dn-cluster.yaml vs the Kubernetes form of the same nodes."""
    recipe = load_recipe("roberta")
    slurm = build_job_spec(recipe, load_queues(REPO / "jobs" / "p3dn-cluster.yaml")["p3dn"], 8)
    k8s = render(recipe, "p3dn.24xlarge", 8, image="img:1")
    container = _worker_pod(_job(k8s))["containers"][0]
    assert container["command"] == ["torchrun"] and container["args"][:3] == ["--no-python", "bash", "-c"]
    # Run the container's command line as one torchrun worker would (rank 13 = node 1, local rank 5), with the
    # program replaced by a stand-in that prints its argv.
    printer = tmp_path / "print-argv"
    printer.write_text("#!/bin/sh\nexec python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' \"$@\"\n")
    printer.chmod(0o755)
    args = container["args"][1:]
    assert args[3] == "fairseq-train"
    args[3] = str(printer)
    worker_env = {"PATH": os.environ["PATH"], "RANK": "13", "LOCAL_RANK": "5", "MASTER_ADDR": "roberta-worker-0",
                  "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "2"}
    res = subprocess.run(args, env=worker_env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    # The rendezvous port is torchrun's (a fresh one per round: tests/test_elastic_restart.py).
    expected = preview_argv(slurm.command, {"RANK": "13", "LOCAL_RANK": "5",
                                            "MASTER_ADDR": "roberta-worker-0", "MASTER_PORT": "29500"})
    assert json.loads(res.stdout) == expected[1:]
    assert "--update-freq" in expected and expected[expected.index("--distributed-world-size") + 1] == "64"
    # The same derived values, from the same code. Only two differ by target: Slurm's node-boot rule (pods start
    # on running nodes) and the CPUs per rank (a pod leaves a tenth of the node to the node's daemons).
    per_target = ("--wait-all-nodes", "cpus per task")
    both = {d.key: d.value for d in slurm.derived if d.key not in per_target}
    assert {d.key: d.value for d in k8s.spec.derived if d.key not in per_target} == both
    assert (slurm.cpus_per_task, k8s.spec.cpus_per_task) == (12, 10)  # 96 vCPUs / 8 ranks; 86 requested / 8
    for key, value in both.items():
        if key != "software":
            assert f"#   {key} = {value}  (" in k8s.text
    assert {e["name"]: e["value"] for e in container["env"]} == {**slurm.environ, **dict(TORCHRUN_ENV),
                                                                  "OMP_NUM_THREADS": "10"}
    spec = _job(k8s)["spec"]
    assert spec["pytorchReplicaSpecs"]["Worker"]["replicas"] * int(spec["nprocPerNode"]) == slurm.world_size


def test_the_slurm_warnings_come_with_the_kubernetes_form():
    """resnet50 on 32 x p4d: a global batch of 65,536 gets the same large-batch warning on both targets."""
    from toolkit.cluster.queues import Queue

    recipe = load_recipe("resnet50")
    slurm = build_job_spec(recipe, Queue(name="p4d", instance_type="p4d.24xlarge", max_nodes=32, efa_enabled=True), 32)
    k8s = render(recipe, "p4d.24xlarge", 32, image="img:1")
    assert slurm.warnings and k8s.spec.warnings == slurm.warnings
    assert f"#   {slurm.warnings[0]}" in k8s.text
    res = run_hpc("k8s", "render", "resnet50", "--nodes", "32", "--instance", "p4d.24xlarge", "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["warnings"] == list(slurm.warnings)
    assert f"warning: {slurm.warnings[0]}" in res.stderr


def test_help_does_not_load_the_kubernetes_libraries():
    res = subprocess.run([os.sys.executable, "-X", "importtime", "-m", "toolkit", "--help"], capture_output=True,
                         text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60)
    assert res.returncode == 0 and "k8s" in res.stdout
    loaded = {line.split("|")[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    assert "toolkit.cli.k8s" in loaded
    assert not {m for m in loaded if m.split(".")[0] in ("kubernetes_validate", "kubeflow", "kubernetes",
                                                          "jsonschema", "yaml")} | ({"toolkit.k8s"} & loaded)



@pytest.mark.training
@pytest.mark.parametrize("name", ["resnet50", "roberta"])
def test_real_torchrun_starts_each_worker_with_the_slurm_ranks_argv(name, tmp_path):
    """torchrun (torch's own, from the training environment) run with the container's arguments and the PET_*
    variables the Training Operator sets; one node of 2 workers, with PET_STANDALONE standing in for the
    operator's rendezvous Service. Each worker's argv must be the Slurm rank's argv for the same rank."""
    import sys

    k8s = render(load_recipe(name), "p3dn.24xlarge", 1, image="img:1")
    container = _worker_pod(_job(k8s))["containers"][0]
    printer = tmp_path / "record-argv"  # one file per worker: torchrun interleaves the workers' stdout
    printer.write_text("#!/bin/sh\nexec python3 -c 'import json,os,sys; json.dump([sys.argv[1:], "
                       "{k: os.environ[k] for k in (\"RANK\", \"LOCAL_RANK\", \"MASTER_ADDR\", \"MASTER_PORT\", "
                       "\"OMP_NUM_THREADS\")}], "
                       "open(os.path.join(os.environ[\"ARGV_DIR\"], os.environ[\"RANK\"]), \"w\"))' \"$@\"\n")
    printer.chmod(0o755)
    args = list(container["args"])
    args[4] = str(printer)  # the program: fairseq-train, or python for `python -m MODULE`
    (tmp_path / "argv").mkdir()
    env = dict(os.environ, **{e["name"]: e["value"] for e in container["env"]}, PET_NNODES="1:1",
               PET_NPROC_PER_NODE="2", PET_MAX_RESTARTS="0", PET_STANDALONE="1", ARGV_DIR=str(tmp_path / "argv"))
    torchrun = os.path.join(os.path.dirname(sys.executable), container["command"][0])
    res = subprocess.run([torchrun, *args], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    workers = [json.loads((tmp_path / "argv" / rank).read_text()) for rank in ("0", "1")]
    for argv, seen in workers:
        slurm_rank = {"RANK": seen["RANK"], "LOCAL_RANK": seen["LOCAL_RANK"],
                      "MASTER_ADDR": seen["MASTER_ADDR"], "MASTER_PORT": seen["MASTER_PORT"]}
        assert argv == preview_argv(k8s.spec.command, slurm_rank)[1:]
        assert seen["OMP_NUM_THREADS"] == "10"  # the rank's CPUs (86 requested / 8 ranks), not torchrun's 1


STAND_IN_WORKER = """\
import datetime, os, signal, sys
import torch, torch.distributed as dist
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo", init_method=sys.argv[1], rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=20))
total = torch.ones(1)
dist.all_reduce(total)
if attempt == 0 and rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)  # a worker lost mid-job
dist.barrier()
print(f"attempt {attempt} rank {rank} sum {total.item():.0f}", flush=True)
"""


@pytest.mark.training
def test_a_killed_worker_restarts_the_group_under_the_rendered_command_line(tmp_path):
    """The container's torchrun arguments and torchrun's env (a store per round) around a stand-in worker
    that rendezvouses like fairseq (--distributed-init-method tcp://MASTER_ADDR:MASTER_PORT) and is SIGKILLed on
    the first attempt: torchrun's restart must complete. Without the fresh store torch 2.14's restarted workers
    failed or hung here."""
    import sys

    from toolkit.k8s.manifests import torchrun_args

    worker = tmp_path / "worker.py"
    worker.write_text(STAND_IN_WORKER)
    command = (sys.executable, str(worker), ("tcp://", RankVar.MASTER_ADDR, ":", RankVar.MASTER_PORT))
    env = dict(os.environ, **dict(TORCHRUN_ENV), PET_NNODES="1:1", PET_NPROC_PER_NODE="2", PET_MAX_RESTARTS="1",
               PET_STANDALONE="1")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    res = subprocess.run([torchrun, *torchrun_args(command)], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    # torchrun interleaves the workers' stdout: find the lines rather than split it
    assert sorted(re.findall(r"attempt \d+ rank \d+ sum \d+", res.stdout)) == [
        "attempt 1 rank 0 sum 2", "attempt 1 rank 1 sum 2"]
