"""Kubernetes forms of the recipes: rendered from the JobSpec, validated offline against the real schemas.

No API server exists here. What stands in for it: the manifests read back with kubectl's YAML rules (go-yaml v2,
toolkit.k8s.kubeyaml), the operators' published CRDs (kubeflow/trainer v1.9.4, kubeflow/mpi-operator v0.8.0) with
the API server's structural-schema semantics, kubernetes-validate's strict core schemas, and the core pod and
operator admission rules (toolkit.k8s.admission). A worker's argv is checked by running the container's own
command line in bash with the variables torchrun gives each worker.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import cli_json, REPO, run_hpc
from tests.jobhelpers import run_pods_torchrun
from tests.test_k8s_crd import KUBECTL, kubectl_json, same_json
from toolkit.cluster.queues import load_queues
from toolkit.errors import HpcError
from toolkit.job.rank import RankVar, preview_argv
from toolkit.job.spec import TORCHRUN_ENV
from toolkit.slurm.materialize import build_job_spec
from toolkit.k8s.kubeyaml import dump_all
from toolkit.k8s.manifests import EFA, GPU, HUGEPAGES, LAUNCHER_BACKOFF_LIMIT, Storage, render
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
        # the launcher waits for every worker to be Ready (images pulled), then may retry as AWS's EKS sample does
        assert job["spec"]["launcherCreationPolicy"] == "WaitForWorkersReady"
        assert job["spec"]["runPolicy"]["backoffLimit"] == LAUNCHER_BACKOFF_LIMIT == 20
        assert job["spec"]["runPolicy"]["activeDeadlineSeconds"] == 30 * 60  # the recipe's time, as Slurm's --time
        launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
        assert launcher["args"][:6] == ["--allow-run-as-root", "-np", str(nodes * 8), "--map-by", "ppr:8:node",
                                        "--bind-to"]
        # the image's nccl-tests, not the Slurm form's build on FSx
        assert it.command[0] == "/fsx/nccl-tests/build/all_reduce_perf"
        assert launcher["args"][-len(it.command):] == ["/opt/nccl-tests/build/all_reduce_perf", *it.command[1:]]
    # requests leave room for the node's daemons; /dev/shm is memory-backed and sized for data loaders
    requests = pod["containers"][0]["resources"]["requests"]
    assert 0 < int(requests["cpu"]) < {"p4d.24xlarge": 96, "p5.48xlarge": 192}[itype]
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]
    assert shm["medium"] == "Memory" and int(shm["sizeLimit"][:-2]) >= 64
    claim = next(v for v in pod["volumes"] if v["name"] == "fsx")["persistentVolumeClaim"]["claimName"]
    assert rendered.documents[1]["metadata"]["name"] == claim
    assert rendered.documents[1]["spec"]["accessModes"] == ["ReadWriteMany"]
    assert rendered.documents[0]["provisioner"] == "fsx.csi.aws.com"


K8S_RECIPES = {"resnet50": "PyTorchJob", "roberta": "PyTorchJob", "transformer": "PyTorchJob",
               "collectives": "PyTorchJob", "nccl-tests": "MPIJob"}


@pytest.mark.parametrize("name", sorted(K8S_RECIPES))
@pytest.mark.parametrize("itype", ["p4d.24xlarge", "p5.48xlarge", "p3dn.24xlarge", "g5.48xlarge"])
def test_every_recipe_renders_manifests_the_api_server_and_operators_accept(name, itype):
    """1, 3 and 16 nodes, with EFA and a StorageClass or without EFA on an existing claim: read back with kubectl's
    YAML rules, every document passes its CRD or core schema (strict), the pod and operator admission rules and
    the toolkit's checks, and kubectl itself (where installed) reads exactly the rendered documents. fairseq's
    recipes refuse 3 nodes (their update-freq would not be a whole number)."""
    texts, documents = [], []
    for nodes in (1, 3, 16):
        for efa, storage in ((None, Storage(storage_class="fsx-lustre")), (False, Storage())):
            try:
                rendered = render(load_recipe(name), itype, nodes, efa=efa, storage=storage, image="img:1")
            except HpcError as exc:
                assert nodes == 3 and name in ("roberta", "transformer") and "not a whole number" in exc.message
                continue
            report = validate_text(rendered.text)
            assert report["valid"] and not [f for f in report["findings"] if f["level"] == "error"], report
            assert rendered.documents[-1]["kind"] == K8S_RECIPES[name]
            assert len(rendered.documents) == (3 if storage.storage_class else 1)
            texts.append(rendered.text)
            documents += rendered.documents
    if KUBECTL:  # what kubectl sends is what was rendered, type for type
        assert same_json(kubectl_json("\n".join(texts)), documents)


PLANTED = {  # a hand edit of the rendered roberta-8xp5 manifests -> (path, words of the message)
    "numeric arg": (lambda t: t.replace("- '1e-06'", "- 1e-06"),
                    "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].args[19]",
                    "must be a string, not the number 1e-06"),
    "unknown field": (lambda t: t.replace("  nprocPerNode:", "  nProcsPerNode:"),
                      "spec.nProcsPerNode", "unknown field"),
    "requests != limits": (lambda t: t.replace("vpc.amazonaws.com/efa: 32\n                hugepages-2Mi",
                                               "vpc.amazonaws.com/efa: 16\n                hugepages-2Mi", 1),
                           'spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].resources.requests'
                           '["vpc.amazonaws.com/efa"]', "must be equal to vpc.amazonaws.com/efa limit (32)"),
    "wrong EFA count": (lambda t: t.replace("vpc.amazonaws.com/efa: 32", "vpc.amazonaws.com/efa: 64"),
                        'spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].resources.limits'
                        '["vpc.amazonaws.com/efa"]', "64 EFA devices requested; p5.48xlarge has 32"),
    "replicas != nodes": (lambda t: t.replace("      replicas: 8", "      replicas: 6"),
                          "spec.pytorchReplicaSpecs.Worker.replicas",
                          "6 worker pods, but torchrun's rendezvous takes 8 nodes"),
    "hugepages not whole pages": (lambda t: t.replace("hugepages-2Mi: 5120Mi", "hugepages-2Mi: 5121Mi"),
                                  'spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].resources.limits'
                                  '.hugepages-2Mi', "5121Mi is not positive integer multiple of hugepages-2Mi"),
    "job name": (lambda t: t.replace("  name: roberta\n", "  name: 8-roberta\n", 1), "metadata.name",
                 "should match a DNS-1035 label"),
}


@pytest.mark.parametrize("fault", sorted(PLANTED))
def test_planted_faults_are_caught_by_hpc_k8s_validate_with_their_field_path(fault, tmp_path):
    plant, path, message = PLANTED[fault]
    text = (REPO / "jobs" / "k8s" / "roberta-8xp5.yaml").read_text()
    planted = plant(text)
    assert planted != text
    bad = tmp_path / "bad.yaml"
    bad.write_text(planted)
    res = run_hpc("k8s", "validate", str(bad), "--json")
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    errors = [(f["path"], f["message"]) for f in cli_json(res)["findings"] if f["level"] == "error"]
    assert path in [p.split(": ", 1)[1] for p, m in errors if message in m and p.startswith("document 3 (")], errors
    res = run_hpc("k8s", "validate", str(bad))
    assert res.returncode == 1 and re.search(rf"^error   document 3 \(PyTorchJob/\S+\): {re.escape(path)}$", res.stdout,
                                             re.M), res.stdout


def _field_paths(node, path=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield path + (key,)
            yield from _field_paths(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield path + (i,)
            yield from _field_paths(value, path + (i,))


ODD_VALUES = [None, "", "x", "8", 0, -1, 1.5, True, [], {}, ["a"], {"a": 1}, [{"name": 1}]]


@functools.cache
def _rendered_documents(name: str) -> list[dict]:
    return _render(name, "p4d.24xlarge", 2).documents


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_value_anywhere_gives_findings_never_a_traceback(data):
    """A hand-edited manifest with any field of any type: validation reports it (or accepts it), it never fails."""
    docs = copy.deepcopy(_rendered_documents(data.draw(st.sampled_from(["roberta", "nccl-tests"]))))
    for _ in range(data.draw(st.integers(1, 3))):
        doc = data.draw(st.sampled_from(docs))
        path = data.draw(st.sampled_from(list(_field_paths(doc))))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = copy.deepcopy(data.draw(st.sampled_from(ODD_VALUES)))
    report = validate_text(dump_all(docs))
    assert report["valid"] == (not [f for f in report["findings"] if f["level"] == "error"])


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
        return [(f["path"], f["fix"]) for f in _errors(dump_all(planted))]

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
    found = dict(caught(ranks))  # an MPIJob's mpirun -np then also exceeds its workers' slots
    assert "8" in found[f"{job_doc}: {key}"] and len(found) == (1 if kind == "PyTorchJob" else 2)

    def typo(d):
        d[2]["spec"][replicas]["Worker"]["template"]["spec"]["containers"][0]["comand"] = ["x"]
    [(path, fix)] = caught(typo)
    assert path == f"{job_doc}: {pod}.containers[0].comand" and fix.startswith("remove the key")


def test_the_operators_crd_decides_not_a_python_model():
    """kubeflow-training's Python model called runPolicy required; the v1.9.4 CRD (what the API server applies)
    does not. pytorchReplicaSpecs it does require, and a wrong type deep in the elastic policy is caught."""
    job = _job(_render("resnet50", "p4d.24xlarge", 3))
    del job["spec"]["runPolicy"]
    assert _errors(dump_all([job])) == []
    limits = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    limits[GPU] = "eight"  # a quantity: int-or-string, and the CRD's quantity pattern
    [found] = _errors(dump_all([job]))
    assert found["path"].endswith('resources.limits["nvidia.com/gpu"]') and found["message"].startswith(
        "'eight' does not match the pattern ^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))")
    limits[GPU] = 8
    job["spec"]["elasticPolicy"]["maxRestarts"] = "three"
    replicas = job["spec"].pop("pytorchReplicaSpecs")
    found = {(f["path"], f["message"]) for f in _errors(dump_all([job]))}
    assert found == {("document 1 (PyTorchJob/resnet50): spec.pytorchReplicaSpecs", "required"),
                     ("document 1 (PyTorchJob/resnet50): spec.elasticPolicy.maxRestarts",
                      'must be an integer, not the string "three"')}
    job["spec"]["pytorchReplicaSpecs"] = {"Chief": replicas["Worker"]}  # the webhook knows Master and Worker
    del job["spec"]["elasticPolicy"]
    assert [(f["path"], f["message"]) for f in _errors(dump_all([job]))] == [
        ("document 1 (PyTorchJob/resnet50): spec.pytorchReplicaSpecs.Chief",
         "unsupported replica type 'Chief': Master or Worker")]


def test_core_kinds_are_checked_against_the_kubernetes_schemas():
    docs = _render("roberta", "p5.48xlarge", 8).documents
    docs[0]["parameters"]["perUnitStorageThroughput"] = 250  # StorageClass parameters are strings
    docs[1]["spec"]["accessModes"] = "ReadWriteMany"  # a list
    docs[1]["metadata"]["lables"] = {}
    found = [(f["path"], f["message"]) for f in _errors(dump_all(docs))]
    assert found == [
        ("document 1 (StorageClass/fsx-lustre): parameters.perUnitStorageThroughput",
         "must be a string, not the integer 250"),
        ("document 2 (PersistentVolumeClaim/fsx-claim): metadata.lables",
         "unknown field: the API server rejects it under kubectl's --validate=strict (its default), drops it "
         "otherwise"),
        ("document 2 (PersistentVolumeClaim/fsx-claim): spec.accessModes",
         'must be a list, not the string "ReadWriteMany"'),
    ]


def test_validate_cli_names_document_path_and_fix(tmp_path):
    docs = _render("resnet50", "p4d.24xlarge", 3).documents
    docs[1]["spec"]["accessModes"] = ["ReadWriteOnce"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(dump_all(docs))
    res = run_hpc("k8s", "validate", str(bad))
    assert res.returncode == 1, res.stderr
    assert "INVALID" in res.stdout and "document 2 (PersistentVolumeClaim/fsx-claim): spec.accessModes" in res.stdout
    assert "fix: use accessModes: [ReadWriteMany]" in res.stdout
    res = run_hpc("k8s", "validate", str(bad), "--json")
    assert res.returncode == 1 and cli_json(res)["valid"] is False
    bad.write_text("kind: [unclosed\n")
    res = run_hpc("k8s", "validate", str(bad))
    assert res.returncode == 1 and "not valid YAML" in res.stdout and "Traceback" not in res.stderr


@pytest.mark.parametrize("args,message", [
    (["nccl-tests", "--nodes", "2", "--instance", "m5.xlarge"], "runs on GPUs only; m5.xlarge has no GPUs"),
    (["resnet50", "--nodes", "2", "--instance", "p3.16xlarge", "--efa"], "p3.16xlarge has no EFA devices"),
    (["nccl-tests", "--nodes", "2", "--instance", "p4d.24xlarge", "--set", "launcher.mpi=null"],
     "launcher kind binary without `mpi` has no Kubernetes form"),
    (["roberta", "--nodes", "2", "--instance", "p4d.24xlarge", "--profile", "smoke"], "has no Kubernetes form"),
    (["resnet50", "--nodes", "2", "--instance", "trn1.32xlarge"],
     "trn1.32xlarge has Trainium (neuron) accelerators: hpc makes no jobs for them"),
    (["resnet50", "--nodes", "2", "--instance", "inf2.48xlarge"],
     "inf2.48xlarge has Inferentia2 (neuron) accelerators: hpc makes no jobs for them"),
    (["resnet50", "--nodes", "2", "--instance", "dl2q.24xlarge"],
     "dl2q.24xlarge has Qualcomm AI 100 (qualcomm) accelerators: hpc makes no jobs for them"),
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


@pytest.mark.parametrize("option,value,like", [("--namespace", "Team_A", "team-a"), ("--namespace", "a.b", "a-b"),
                                                ("--fsx-claim", "Fsx_Claim", "fsx-claim"),
                                                ("--fsx-storage-class", "_fsx.SC.", "fsx.sc")])
def test_a_name_the_api_server_refuses_is_refused_at_render_with_one_it_accepts(option, value, like, tmp_path):
    """A namespace, claim or StorageClass name Kubernetes refuses (the render wrote it and `hpc k8s validate`
    refused it): a usage error before anything is written, whose suggested name renders manifests that validate."""
    args = ["resnet50", "--nodes", "2", "--instance", "p4d.24xlarge", "-o", str(tmp_path / "m.yaml")]
    res = run_hpc("k8s", "render", *args, option, value)
    assert res.returncode == 2 and f"{option} {value!r} is not a name Kubernetes accepts" in res.stderr, res.stderr
    assert res.stderr.strip().splitlines()[-1] == f"  fix: e.g. {option} {like}"
    assert not (tmp_path / "m.yaml").exists()
    assert run_hpc("k8s", "render", *args, option, like).returncode == 0
    found = validate_text((tmp_path / "m.yaml").read_text(), str(tmp_path / "m.yaml"))
    assert found["valid"], found["findings"]


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
    # The same derived values, from the same code. Only these differ by target: Slurm's node-boot rule (pods start
    # on running nodes), srun's CPU binding, the CPUs per rank (a pod leaves a tenth of the node to its daemons), and
    # the pre-flight (a job step of the Slurm job's batch shell), and the fleet's node ledger its batch shell exports.
    per_target = ("--wait-all-nodes", "srun cpu binding", "cpus per task", "pre-flight", "fleet ledger")
    both = {d.key: d.value for d in slurm.derived if d.key not in per_target}
    assert {d.key: d.value for d in k8s.spec.derived if d.key not in per_target} == both
    assert (slurm.cpus_per_task, k8s.spec.cpus_per_task) == (12, 10)  # 96 vCPUs / 8 ranks; 86 requested / 8
    for key, value in both.items():
        if key != "software":
            assert f"#   {key} = {value}  (" in k8s.text
    # (but the loader path the Slurm job prepends to the node's: a pod keeps its image's)
    assert {e["name"]: e["value"] for e in container["env"]} == {
        **{v.name: v.value for v in slurm.env if not v.prepend}, **dict(TORCHRUN_ENV), "OMP_NUM_THREADS": "10"}
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
    assert res.returncode == 0 and cli_json(res)["warnings"] == list(slurm.warnings)
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
    run_pods_torchrun(container, args, 120, ARGV_DIR=str(tmp_path / "argv"))
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


@pytest.mark.training
def test_a_manifest_is_refused_where_the_launchers_own_parser_refuses_its_arguments(tmp_path):
    """k8s render plans the job as a Slurm plan does: fairseq-train's own parser reads the arguments first."""
    out = tmp_path / "roberta.yaml"
    res = run_hpc("k8s", "render", "roberta", "--nodes", "2", "--instance", "p4d.24xlarge",
                  "--set", "args.--lrr=0.1", "-o", str(out))
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "unknown argument --lrr (from --set args.--lrr=0.1)" in res.stderr and "did you mean --lr?" in res.stderr
    assert not out.exists()
