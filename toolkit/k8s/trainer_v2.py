"""The JobSpec as Kubeflow Trainer v2 objects (trainer.kubeflow.org/v1alpha1): TrainJob on a training runtime.

Trainer v2 (kubeflow/trainer >= v2.2; the objects here follow v2.3.0) replaced the PyTorchJob/MPIJob of the
Training Operator v1 with TrainJob + (Cluster)TrainingRuntime: the runtime holds the JobSet template and the ML
policy, the TrainJob names a runtime and sets the trainer (image, command, args, env, numNodes, numProcPerNode,
resourcesPerNode); pod-level settings (node selector, tolerations, volumes and mounts) go in runtimePatches
(pkg/apis/trainer/v1alpha1/trainjob_types.go). There is no ElasticPolicy:

  training launchers -> TrainJob on the default ClusterTrainingRuntime `torch-distributed`
                        (manifests/base/runtimes/torch_distributed.yaml). Its torch plugin gives the node
                        container PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR (node 0's pod)
                        and PET_MASTER_PORT (pkg/runtime/framework/plugins/torch/torch.go): torchrun's static
                        rendezvous, in which no node ever waits for a new round and one store serves for good
                        (torch static_tcp_rendezvous.py), so the group cannot restart after a worker fails.
                        The args turn that address into a c10d
                        rendezvous (Kubernetes expands $(VAR) from the container's env), so a killed worker
                        restarts the group in place as on Slurm and under a PyTorchJob, with the same store per
                        round (toolkit.job.spec.TORCHRUN_ENV).
  MPI binaries       -> TrainJob on a TrainingRuntime rendered with it (v2.3.0 ships no plain MPI runtime, and a
                        TrainJob cannot set the image of an MPI runtime's worker pods: ContainerPatch has none).

Both are translated from the v1 objects toolkit.k8s.manifests renders from the JobSpec, so the pods (resources,
devices, volumes, env, argv) are the same in both forms by construction.
"""

from __future__ import annotations

import copy
import re
from typing import Iterator

from toolkit.k8s.crd import DNS1123_SUBDOMAIN, dns1035_label
from toolkit.k8s.violations import Violation

API_VERSION = "trainer.kubeflow.org/v1alpha1"
GROUP = "trainer.kubeflow.org"
TORCH_RUNTIME = "torch-distributed"
NODE = "node"  # the trainer container and the worker replicated job of Trainer's runtimes (pkg/constants)
LAUNCHER = "launcher"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"  # marks the job the TrainJob's trainer sets
# runtimePatches[].manager: who owns a patch; a domain-prefixed path (the jobset plugin's IsDomainPrefixedPath)
MANAGER = "hpc-toolkit/k8s-render"
# kubeflow/trainer v2.3.0 pkg/constants/constants.go: the variables the torch plugin sets (TorchRunReservedEnvNames)
# and the containers whose env only the TrainJob's trainer/initializer may set (the jobset plugin's Validate)
TORCH_RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
ENV_BY_TRAINJOB_ONLY = ("dataset-initializer", "model-initializer", NODE)
# torchrun's c10d rendezvous on node 0's pod, where the torch plugin's static one would be (torch.go sets both)
C10D_ARGS = ("--rdzv-backend=c10d", "--rdzv-endpoint=$(PET_MASTER_ADDR):$(PET_MASTER_PORT)")


def from_v1(job: dict) -> list[dict]:
    """The Trainer v2 objects of a v1 PyTorchJob or MPIJob."""
    return [torch_train_job(job)] if job["kind"] == "PyTorchJob" else [mpi_runtime(job), mpi_train_job(job)]


def torch_train_job(pytorch_job: dict) -> dict:
    spec = pytorch_job["spec"]
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    pod = worker["template"]["spec"]
    container = pod["containers"][0]
    args = [*C10D_ARGS, f"--max-restarts={spec['elasticPolicy']['maxRestarts']}", *container["args"]]
    patch = {key: pod[key] for key in ("nodeSelector", "tolerations", "volumes") if key in pod}
    patch["containers"] = [{"name": NODE, "volumeMounts": container["volumeMounts"]}]
    return {
        "apiVersion": API_VERSION, "kind": "TrainJob", "metadata": pytorch_job["metadata"],
        "spec": {
            "runtimeRef": {"name": TORCH_RUNTIME, "apiGroup": GROUP, "kind": "ClusterTrainingRuntime"},
            "trainer": {"image": container["image"], "command": container["command"], "args": args,
                        "env": container["env"], "numNodes": worker["replicas"],
                        "numProcPerNode": int(spec["nprocPerNode"]), "resourcesPerNode": container["resources"]},
            "runtimePatches": [{"manager": MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
                {"name": NODE, "template": {"spec": {"template": {"spec": patch}}}}]}}}}],
        },
    }


def _mpi_parts(mpi_job: dict) -> tuple[dict, dict, dict]:
    replicas = mpi_job["spec"]["mpiReplicaSpecs"]
    return mpi_job["spec"], replicas["Launcher"]["template"]["spec"]["containers"][0], replicas["Worker"]


def mpi_runtime(mpi_job: dict) -> dict:
    """A TrainingRuntime for an MPI binary: the MPIJob's worker pods (an sshd per node, all GPUs and EFA devices)
    and one launcher pod that runs mpirun once every node pod is ready; shaped as Trainer's deepspeed-distributed
    runtime (kubeflow/trainer v2.3.0 manifests/base/runtimes/deepspeed_distributed.yaml: `node` listed first, then
    `launcher` depending on it), with the image's root sshd and a launcher pod of its own (no runLauncherAsNode).

    The order: JobSet's admission refuses dependsOn on the first replicated job and a dependsOn naming a later one
    (kubernetes-sigs/jobset v0.12.0, the release Trainer v2.3.0 builds on, pkg/webhooks/jobset_webhook.go).
    The counts: the Trainer gives the replicated job labelled trainer-ancestor (the launcher) mlPolicy.numNodes
    pods (kubeflow/trainer v2.3.0 pkg/runtime/core/trainingruntime.go newRuntimeInfo; the jobset plugin's
    SyncParallelCount makes it the Job's parallelism), and the `node` job the TrainJob's trainer.numNodes
    (pkg/runtime/framework/plugins/mpi/mpi.go EnforceMLPolicy): so numNodes is 1 here, the node count is the
    TrainJob's. toolkit.k8s.validate checks both rules."""
    spec, launcher, worker = _mpi_parts(mpi_job)
    node = copy.deepcopy(worker["template"]["spec"])
    node["containers"][0]["name"] = NODE
    metadata = {**mpi_job["metadata"], "name": runtime_name(mpi_job)}
    # the MPIJob's retries and time limit are its launcher Job's; here they are set on that Job directly (its
    # deadline counts from its start, once every node pod is Ready, as the MPIJob's launcher's does)
    launcher_limits = {key: spec["runPolicy"][key] for key in ("backoffLimit", "activeDeadlineSeconds")
                       if key in spec["runPolicy"]}
    return {
        "apiVersion": API_VERSION, "kind": "TrainingRuntime", "metadata": metadata,
        "spec": {
            "mlPolicy": {"numNodes": 1, "mpi": {  # one launcher pod (see above), one mpirun
                "numProcPerNode": spec["slotsPerWorker"], "mpiImplementation": spec["mpiImplementation"],
                "sshAuthMountPath": "/root/.ssh"}},
            "template": {"spec": {
                "network": {"publishNotReadyAddresses": True},
                "successPolicy": {"operator": "All", "targetReplicatedJobs": [LAUNCHER]},
                "replicatedJobs": [
                    {"name": NODE, "template": {"spec": {"template": {"spec": node}}}},
                    {"name": LAUNCHER, "dependsOn": [{"name": NODE, "status": "Ready"}],
                     "template": {"metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
                                  "spec": {**launcher_limits, "template": {"spec": {
                                      "containers": [{"name": NODE, "image": launcher["image"],
                                                      "resources": launcher["resources"]}]}}}}},
                ]}},
        },
    }


def runtime_name(mpi_job: dict) -> str:
    return f"{mpi_job['metadata']['name']}-mpi"  # a DNS subdomain (up to 253 characters), like any object's name


def mpi_train_job(mpi_job: dict) -> dict:
    _, launcher, worker = _mpi_parts(mpi_job)
    return {
        "apiVersion": API_VERSION, "kind": "TrainJob", "metadata": mpi_job["metadata"],
        "spec": {
            "runtimeRef": {"name": runtime_name(mpi_job), "apiGroup": GROUP, "kind": "TrainingRuntime"},
            "trainer": {"image": launcher["image"], "command": launcher["command"], "args": launcher["args"],
                        "env": launcher["env"], "numNodes": worker["replicas"]},
        },
    }


# The TrainJob CRD's CEL rules that admission_violations evaluates (its name rules): no "not checked" note for them.
CEL_RULES_CHECKED = frozenset({"self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
                               "size(self.metadata.name) <= 63"})


def admission_violations(job: dict) -> Iterator[Violation]:
    """What Trainer v2.3.0 rejects in a TrainJob beyond its CRD's schema: the CRD's CEL rules on the name (the
    offline schema check does not run CEL), the jobset plugin's runtimePatches rules
    (pkg/runtime/framework/plugins/jobset/jobset.go Validate) and, on the default torch-distributed runtime, the
    torch plugin's reserved env (plugins/torch/torch.go Validate)."""
    name = (job.get("metadata") or {}).get("name") or ""
    if not dns1035_label(name):
        yield Violation(("metadata", "name"), f"{name!r}: metadata.name must match RFC 1035 DNS label format (lower-"
                        "case letters, digits and '-', starting with a letter, at most 63 characters)")
    spec = job.get("spec") or {}
    for p, patch in enumerate(spec.get("runtimePatches") or []):
        manager = patch.get("manager") or ""
        host, _, path = manager.partition("/")
        if not (path and DNS1123_SUBDOMAIN.fullmatch(host)
                and re.fullmatch(r"[A-Za-z0-9/\-._~%!$&'()*+,;=:]+", path)):
            yield Violation(("spec", "runtimePatches", p, "manager"), f"{manager!r}: must be a domain-prefixed path "
                            "(such as \"acme.io/foo\")")
        jobs = ((((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {})
                .get("replicatedJobs") or [])
        for j, rjob in enumerate(jobs):
            pod = ((((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {})
            for c, container in enumerate(pod.get("containers") or []):
                if container.get("env") and container.get("name") in ENV_BY_TRAINJOB_ONLY:
                    yield Violation(("spec", "runtimePatches", p, "trainingRuntimeSpec", "template", "spec",
                                     "replicatedJobs", j, "template", "spec", "template", "spec", "containers", c,
                                     "env"), f"must not have envs for the {', '.join(ENV_BY_TRAINJOB_ONLY)} "
                                    "containers (set the node's through spec.trainer.env)")
    if (spec.get("runtimeRef") or {}).get("name") == TORCH_RUNTIME:
        for e, env in enumerate((spec.get("trainer") or {}).get("env") or []):
            if env.get("name") in TORCH_RESERVED_ENV:
                yield Violation(("spec", "trainer", "env", e, "name"), f"must not have reserved envs: the torch "
                                f"plugin sets {env['name']} itself")
