"""Kubeflow Trainer v2 forms of the recipes (TrainJob, trainer.kubeflow.org/v1alpha1), checked offline.

No API server here. What stands in for it: `hpc k8s validate` (the text read with kubectl's YAML rules, each custom
resource against Trainer v2.3.0's own CRDs vendored in toolkit/k8s/crds, the core schemas strictly), Trainer v2's
own models (kubeflow-trainer-api 2.3.0: every key and value must survive them), and the Trainer's admission rules
we read in its source (kubeflow/trainer v2.3.0), including the CEL rules the offline validator does not run."""

from __future__ import annotations

import copy
import itertools
import json
import re
import shlex
import subprocess

import pytest

from tests.conftest import cli_json, REPO, run_hpc
from tests.jobhelpers import kubelet_expand
from tests.test_k8s_crd import KUBECTL, kubectl_json, same_json
from toolkit.catalog import instance
from toolkit.errors import HpcError
from toolkit.job.rank import preview_argv
from toolkit.job.spec import TORCHRUN_ENV
from toolkit.k8s.manifests import EFA, GPU, TRAINER_V2, V1, Storage, render, resources
from toolkit.k8s.validate import validate_text
from toolkit.recipes.load import load_recipe

RECIPES = ["collectives", "nccl-tests", "resnet50", "roberta", "transformer"]  # every recipe with a Kubernetes form
INSTANCES = ["p4d.24xlarge", "p5.48xlarge", "p3dn.24xlarge", "g5.48xlarge"]
EXAMPLES = sorted((REPO / "jobs" / "k8s" / "trainer-v2").glob("*.yaml"))


def kept_whole(doc: dict) -> None:
    """The Trainer v2 model of the document's kind reads it and writes back the same document: no unknown key
    (the generated models drop them), no value of another type."""
    from kubeflow_trainer_api import models

    model = {"TrainJob": models.TrainerV1alpha1TrainJob, "TrainingRuntime": models.TrainerV1alpha1TrainingRuntime,
             "ClusterTrainingRuntime": models.TrainerV1alpha1ClusterTrainingRuntime}[doc["kind"]]
    assert model.from_dict(doc).to_dict() == doc


def check_train_job(job: dict, kind: str) -> None:
    """Our TrainJobs' shape (Trainer's own rules are hpc k8s validate's: test_trainer_v2s_admission_rules_...)."""
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and job["kind"] == "TrainJob"
    if kind == "PyTorchJob":
        assert job["spec"]["runtimeRef"] == {"name": "torch-distributed", "apiGroup": "trainer.kubeflow.org",
                                             "kind": "ClusterTrainingRuntime"}
        # the patch targets the runtime's one job and its one container (torch_distributed.yaml: node / node)
        (patch,) = job["spec"]["runtimePatches"]
        (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        assert rjob["name"] == "node"
        assert [c["name"] for c in rjob["template"]["spec"]["template"]["spec"]["containers"]] == ["node"]


def renders():
    for name, nodes, itype, efa, storage_class, api in itertools.product(
            RECIPES, (1, 3, 16), INSTANCES, (None, False), (None, "fsx-lustre"), (TRAINER_V2, V1)):
        yield name, nodes, itype, efa, storage_class, api


def test_every_recipe_renders_on_every_setup_for_both_apis():
    """5 recipes x 1/3/16 nodes x p4d/p5/p3dn/g5 x EFA or TCP x existing claim or StorageClass x v1/v2."""
    count = refused = 0
    for name, nodes, itype, efa, storage_class, api in renders():
        try:
            rendered = render(load_recipe(name), itype, nodes, image="img:1", efa=efa, api=api,
                              storage=Storage(storage_class=storage_class))
        except HpcError as exc:  # fairseq's update-freq must be whole: 3 nodes of 8 GPUs do not divide it
            assert nodes == 3 and name in ("roberta", "transformer") and "--update-freq" in exc.message, exc.message
            refused += 1
            continue
        count += 1
        report = validate_text(rendered.text)
        assert report["valid"], [f for f in report["findings"] if f["level"] == "error"]
        docs = rendered.documents
        assert (docs[0]["kind"] == "StorageClass") == bool(storage_class)
        kind = "MPIJob" if name == "nccl-tests" else "PyTorchJob"
        if api == V1:
            assert docs[-1]["kind"] == kind
            continue
        for doc in docs:
            if doc["apiVersion"].startswith("trainer."):
                kept_whole(doc)
        check_train_job(docs[-1], kind)
        if kind == "MPIJob":
            assert docs[-2]["kind"] == "TrainingRuntime"
            assert docs[-1]["spec"]["runtimeRef"]["name"] == docs[-2]["metadata"]["name"]
    assert (count, refused) == (2 * 5 * 3 * 4 * 2 * 2 - 2 * 2 * 4 * 2 * 2, 2 * 4 * 2 * 2 * 2)


def test_a_train_job_asks_for_the_nodes_devices_and_runs_torchrun_as_the_pytorch_job_does():
    recipe = load_recipe("resnet50")
    v1 = render(recipe, "p5.48xlarge", 16, image="img:1").documents[-1]
    v2 = render(recipe, "p5.48xlarge", 16, image="img:1", api=TRAINER_V2)
    job = v2.documents[-1]
    trainer = job["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (16, 8)
    assert trainer["resourcesPerNode"]["limits"] == {GPU: 8, EFA: 32, "hugepages-2Mi": "5120Mi"}
    v1_container = v1["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert trainer["resourcesPerNode"] == v1_container["resources"]
    assert trainer["env"] == v1_container["env"] and {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"} \
        in trainer["env"] and dict(TORCHRUN_ENV) == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    # torchrun: the same worker command line, with c10d on node 0's pod and in-place restarts
    assert trainer["command"] == ["torchrun"] and trainer["args"][3:] == v1_container["args"]
    assert trainer["args"][:3] == ["--rdzv-backend=c10d", "--rdzv-endpoint=$(PET_MASTER_ADDR):$(PET_MASTER_PORT)",
                                   "--max-restarts=3"]
    pod = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
        "template"]["spec"]["template"]["spec"]
    v1_pod = v1["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert {k: pod[k] for k in ("nodeSelector", "tolerations", "volumes")} == \
        {k: v1_pod[k] for k in ("nodeSelector", "tolerations", "volumes")}
    assert pod["containers"] == [{"name": "node", "volumeMounts": v1_container["volumeMounts"]}]
    assert v2.text.startswith("# TrainJob resnet50 (torch-distributed runtime): ")


def test_the_worker_argv_after_kubernetes_and_bash_is_the_slurm_ranks(tmp_path):
    """The args as the kubelet expands them ($(VAR) from the container's env, $$( a literal $() and as each
    worker's bash runs them: the Slurm rank's argv for the same rank."""
    k8s = render(load_recipe("roberta"), "p5.48xlarge", 2, image="img:1", api=TRAINER_V2)
    trainer = k8s.documents[-1]["spec"]["trainer"]
    pet = {"PET_MASTER_ADDR": "roberta-node-0-0.roberta", "PET_MASTER_PORT": "29500"}  # torch.go's values
    args = [kubelet_expand(a, pet) for a in trainer["args"]]
    assert args[1] == "--rdzv-endpoint=roberta-node-0-0.roberta:29500"
    worker = args[args.index("--no-python") + 1:]
    printer = tmp_path / "print-argv"
    printer.write_text("#!/bin/sh\nexec python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' \"$@\"\n")
    printer.chmod(0o755)
    assert worker[3] == "fairseq-train"
    worker[3] = str(printer)
    rank = {"RANK": "9", "LOCAL_RANK": "1", "MASTER_ADDR": "roberta-node-0-0.roberta", "MASTER_PORT": "41000"}
    res = subprocess.run(worker, env={"PATH": "/usr/bin:/bin", **rank}, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == preview_argv(k8s.spec.command, rank)[1:]


@pytest.mark.parametrize("api", [TRAINER_V2, V1])
def test_a_literal_variable_reference_in_a_recipe_value_reaches_the_worker_as_written(api):
    """`$(HOME)` in an arg or an env value would be replaced by the kubelet; the manifests write `$$(HOME)`."""
    for name, override in (("roberta", "args.--user-dir=$(HOME)"), ("nccl-tests", "args.-n=$(HOME)")):
        job = render(load_recipe(name, overrides=[override, "env.PROBE=a$(HOME)"]), "p4d.24xlarge", 2,
                     image="img:1", api=api).documents[-1]
        containers = [job["spec"]["trainer"]] if api == TRAINER_V2 else \
            [r["template"]["spec"]["containers"][0] for r in (job["spec"].get("pytorchReplicaSpecs") or
                                                              job["spec"]["mpiReplicaSpecs"]).values()]
        container = next(c for c in containers if c.get("env"))
        env = {e["name"]: e["value"] for e in container["env"]}
        args = [kubelet_expand(a, {"HOME": "/root", **env}) for a in container["args"]]
        flag = override.split("=")[0].removeprefix("args.")
        assert args[args.index(flag) + 1] == "$(HOME)" and kubelet_expand(env["PROBE"], {"HOME": "/r"}) == "a$(HOME)"


def test_nccl_tests_run_on_their_own_mpi_runtime():
    docs = render(load_recipe("nccl-tests"), "p4d.24xlarge", 2, image="img:1", api=TRAINER_V2).documents
    runtime, job = docs[-2:]
    policy = runtime["spec"]["mlPolicy"]
    # one launcher (the trainer-ancestor job gets mlPolicy.numNodes pods); the TrainJob sizes the node job
    assert policy == {"numNodes": 1, "mpi": {"numProcPerNode": 8, "mpiImplementation": "OpenMPI",
                                             "sshAuthMountPath": "/root/.ssh"}}
    assert job["spec"]["trainer"]["numNodes"] == 2
    node, launcher = runtime["spec"]["template"]["spec"]["replicatedJobs"]  # as upstream: the launcher after node
    assert node["name"] == "node" and "dependsOn" not in node
    assert launcher["template"]["metadata"]["labels"] == {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    assert launcher["dependsOn"] == [{"name": "node", "status": "Ready"}]
    v1 = render(load_recipe("nccl-tests"), "p4d.24xlarge", 2, image="img:1").documents[-1]["spec"]["runPolicy"]
    assert {k: launcher["template"]["spec"][k] for k in ("backoffLimit", "activeDeadlineSeconds")} == \
        {"backoffLimit": v1["backoffLimit"], "activeDeadlineSeconds": v1["activeDeadlineSeconds"]} == \
        {"backoffLimit": 20, "activeDeadlineSeconds": 1800}
    container = node["template"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "img:1" and container["resources"] == resources(instance("p4d.24xlarge"), 8, 4)
    assert job["spec"]["trainer"]["command"] == ["mpirun"] and "-np" in job["spec"]["trainer"]["args"]


def _runtime_errors(text: str) -> list[tuple[str, str]]:
    report = validate_text(text)
    return [(f["path"].split(": ", 1)[1], f["message"]) for f in report["findings"] if f["level"] == "error"]


@pytest.mark.parametrize("nodes", [2, 4])
def test_an_mpi_runtime_that_jobset_or_the_trainer_would_get_wrong_is_invalid(nodes):
    """The form rendered before issue 31 (launcher listed first with dependsOn, mlPolicy.numNodes = the node count)
    fails validation on both counts; the render passes. Rules: kubernetes-sigs/jobset v0.12.0
    pkg/webhooks/jobset_webhook.go (DependsOn), kubeflow/trainer v2.3.0 pkg/runtime/core/trainingruntime.go and
    pkg/runtime/framework/plugins/mpi/mpi.go (the launcher count)."""
    import yaml

    docs = render(load_recipe("nccl-tests"), "p4d.24xlarge", nodes, image="img:1", api=TRAINER_V2).documents
    assert _runtime_errors(yaml.safe_dump_all(docs)) == []
    runtime = docs[-2]
    old = copy.deepcopy(runtime)
    old["spec"]["mlPolicy"]["numNodes"] = nodes
    old["spec"]["template"]["spec"]["replicatedJobs"].reverse()
    errors = _runtime_errors(yaml.safe_dump_all([*docs[:-2], old, docs[-1]]))
    assert [path for path, _ in errors] == ["spec.template.spec.replicatedJobs[0].dependsOn", "spec.mlPolicy.numNodes"]
    assert "DependsOn can't be set for the first ReplicatedJob" in errors[0][1]
    assert f"{nodes}: on an MPI runtime this is the number of launcher pods" in errors[1][1]
    # a dependsOn naming a job listed after it (or none at all) is refused too; numNodes left out means 1
    later = copy.deepcopy(runtime)
    jobs = later["spec"]["template"]["spec"]["replicatedJobs"]
    jobs.insert(0, {"name": "prep", "template": copy.deepcopy(jobs[0]["template"])})
    jobs[1]["dependsOn"] = [{"name": "launcher", "status": "Ready"}]
    del later["spec"]["mlPolicy"]["numNodes"]
    assert _runtime_errors(yaml.safe_dump_all([later])) == [
        ("spec.template.spec.replicatedJobs[1].dependsOn[0].name",
         "replicatedJob: node cannot depend on replicatedJob: launcher (JobSet's admission: only on one listed "
         "before it)")]


def test_the_cli_renders_trainer_v2_by_default_and_v1_on_request():
    v2 = run_hpc("k8s", "render", "resnet50", "--nodes", "2", "--instance", "p4d.24xlarge", "--json")
    v1 = run_hpc("k8s", "render", "resnet50", "--nodes", "2", "--instance", "p4d.24xlarge", "--api", "v1", "--json")
    assert v2.returncode == 0 and v1.returncode == 0, v2.stderr + v1.stderr
    assert cli_json(v2)["documents"][-1]["kind"] == "TrainJob"
    assert cli_json(v1)["documents"][-1]["kind"] == "PyTorchJob"
    assert "`hpc k8s render resnet50 --nodes 2 --instance p4d.24xlarge --api v1`" in cli_json(v1)["manifests"]
    bad = run_hpc("k8s", "render", "resnet50", "--nodes", "2", "--instance", "p4d.24xlarge", "--api", "v3")
    assert bad.returncode == 2 and "use one of: trainer-v2, v1" in bad.stderr


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_v2_examples_are_the_default_form_and_survive_trainers_models_and_kubectl(path):
    """tests/test_k8s_examples.py re-renders and validates every reviewed render; here what only the TrainJob form
    has: it is what `hpc k8s render` gives without --api, Trainer's models keep it whole, kubectl reads it as is."""
    import yaml

    text = path.read_text()
    command = shlex.split(re.search(r"^# Rendered by `([^`]+)`", text, re.M)[1])
    assert command[:3] == ["hpc", "k8s", "render"] and "--api" not in command
    docs = list(yaml.safe_load_all(text))
    assert any(doc["kind"] == "TrainJob" for doc in docs)
    for doc in docs:
        if doc["apiVersion"].startswith("trainer."):
            kept_whole(doc)
    if KUBECTL:  # kubectl itself sends exactly what was rendered, type for type
        assert same_json(kubectl_json(text), docs)


def test_the_crds_catch_what_trainer_v2_would_refuse():
    """The check is Trainer v2's schema: a field it does not have, or a number as a string, is an error."""
    text = render(load_recipe("resnet50"), "p4d.24xlarge", 2, image="img:1", api=TRAINER_V2).text
    for wrong, right in (("    numProcPerNode: 8\n", "    numProcPerNode: '8'\n"),
                         ("    numProcPerNode: 8\n", "    numProcPerNode: 8\n    elasticPolicy: {maxRestarts: 3}\n")):
        assert wrong in text
        report = validate_text(text.replace(wrong, right))
        errors = [f for f in report["findings"] if f["level"] == "error"]
        assert not report["valid"] and errors and all("spec.trainer" in f["path"] for f in errors), errors


def test_trainer_v2s_admission_rules_are_part_of_validation():
    """What Trainer v2.3.0 rejects beyond the CRD schema (the name's CEL rules, the jobset plugin's runtimePatches
    rules, the torch plugin's reserved env): each breach of a valid render is one error at its key path."""
    text = render(load_recipe("resnet50"), "p4d.24xlarge", 2, image="img:1", api=TRAINER_V2).text
    assert "  name: resnet50\n" in text and "manager: hpc-toolkit/k8s-render\n" in text
    node_mounts = "                    - name: node\n                      volumeMounts:\n"
    assert node_mounts in text
    # the name's CEL rules are evaluated here, so no "not checked offline" note names them
    assert not [f for f in validate_text(text)["findings"] if "metadata.name" in f["message"]]
    breaches = {
        "metadata.name": ("  name: resnet50\n", "  name: Resnet50\n"),
        "metadata.name ": ("  name: resnet50\n", "  name: res.net50\n"),  # a DNS subdomain, not an RFC 1035 label
        "spec.runtimePatches[0].manager": ("manager: hpc-toolkit/k8s-render\n", "manager: hpc-toolkit\n"),
        "spec.trainer.env[0].name": ("    - name: PYTHONUNBUFFERED\n", "    - name: PET_MASTER_PORT\n"),
        "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].template.spec.template.spec."
        "containers[0].env": (node_mounts, node_mounts.replace("volumeMounts:", "env: [{name: A, value: b}]\n"
                                                                "                      volumeMounts:")),
    }
    for path, (right, wrong) in breaches.items():
        report = validate_text(text.replace(right, wrong, 1))
        errors = [f["path"].split(": ", 1)[1] for f in report["findings"] if f["level"] == "error"]
        assert errors == [path.strip()], (path, report["findings"])
