"""Recipe + instance type + nodes -> Kubernetes manifests (Amazon EKS): the JobSpec, in another form.

The JobSpec is built by toolkit.job.spec.job_spec, the scheduler-neutral part of the Slurm form, from a Target
made for the instance type (max nodes = the job's nodes, the pod's share of the CPUs, FSx at /fsx). World size,
scaling (update-freq, LR), device forms, argv and the EFA/NCCL environment therefore come from the one
place that computes them; this module only translates:

  training launchers                           -> Kubeflow PyTorchJob (kubeflow.org/v1), torchrun elastic agent
                                                  (or the launcher's own per-node agent: accelerate launch)
  MPI binaries (nccl-tests)                    -> MPIJob (kubeflow.org/v2beta1), one slot per GPU
  which launcher kind takes which form         -> the launcher's (toolkit.launchers: Launcher.kubernetes_kind)
  a researcher's own script                    -> read from the image, or from a ConfigMap of its bytes mounted
                                                  in the pods (toolkit.k8s.usercode)
  the recipe's dirs                            -> an FSx for Lustre PersistentVolumeClaim (ReadWriteMany)

Per-rank values (toolkit.job.rank.RankVar) are the rank contract's variables, which torchrun sets for its workers
here; each worker's bash expands them, as each Slurm task's bash does under Slurm.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from toolkit.accelerators import family
from toolkit.accelerators.nvidia import NVIDIA
from toolkit.catalog import InstanceType, instance
from toolkit.errors import HpcError
from toolkit.job.rank import Arg
from toolkit.k8s.usercode import PlacedScript, place_script

# The only values a user must supply by hand: flagged by `hpc k8s validate` until they are replaced.
FILL_IN = "<fill in: "
INSTANCE_LABEL = "node.kubernetes.io/instance-type"
GPU = NVIDIA.kubernetes_resource  # the GPUs' extended resource (and taint) a pod requests: Family.kubernetes_resource
EFA = "vpc.amazonaws.com/efa"
HUGEPAGES = "hugepages-2Mi"
# libfabric's EFA provider allocates its bounce buffers from 2 MiB huge pages; a pod gets none unless it asks
# (AWS's EKS EFA samples request 5120Mi per node).
EFA_HUGEPAGES = "5120Mi"
FSX_MOUNT = "/fsx"
FSX_PROVISIONER = "fsx.csi.aws.com"
# FSx for Lustre SCRATCH_2/PERSISTENT_2 capacities are 1200 GiB or multiples of 2400 GiB.
FSX_CAPACITY = "1200Gi"
DEFAULT_CLAIM = "fsx-claim"
# The Kubeflow API a job is rendered for: Trainer v2's TrainJob (toolkit.k8s.trainer_v2), or v1's PyTorchJob (Training
# Operator) and MPIJob (MPI Operator), which existing installations run.
TRAINER_V2, V1 = "trainer-v2", "v1"
APIS = (TRAINER_V2, V1)
# Node daemons (kubelet, VPC CNI, EFA and NVIDIA device plugins, FSx CSI node driver, log/metric agents) and
# the kubelet's own reservations live beside the job: requests leave this share of the node to them.
NODE_RESERVE = 0.1
# /dev/shm for data-loader workers (they pass batches through shared memory; Kubernetes gives 64 MiB):
# a memory-backed emptyDir capped at this share of the pod's memory, which its usage counts against.
SHM_SHARE = 0.25
# torchrun restarts all workers of a node this many times after a failure before the job fails.
MAX_RESTARTS = 3


@dataclasses.dataclass(frozen=True)
class Storage:
    """Where the recipe's dirs live: an existing claim, or a claim made through a StorageClass."""

    claim: str = DEFAULT_CLAIM
    storage_class: str | None = None  # set: render the StorageClass and the claim (dynamic provisioning)


@dataclasses.dataclass(frozen=True)
class Rendered:
    spec: Any  # toolkit.job.spec.JobSpec
    documents: list[dict]
    text: str
    notes: list[str]
    script: dict | None = None  # a researcher's script: where the pods read it (source, path, configmap)


def k8s_target(instance_type: str, nodes: int, efa: bool | None) -> tuple[Any, int]:
    """The target a Kubernetes job is planned on (the instance type, exactly `nodes` nodes, FSx at /fsx), and
    the EFA devices each pod requests."""
    from toolkit.job.spec import Target

    it = instance(instance_type)
    if efa and not it.has_efa:
        raise HpcError(f"--efa given, but {instance_type} has no EFA devices (efa_interfaces: 0 in the catalog)",
                       fix="drop --efa (NCCL then uses TCP), or choose an instance with EFA, e.g. p4d.24xlarge")
    use_efa = it.has_efa if efa is None else efa
    tasks = (it.gpus if it.accelerator != "none" else 0) or 1  # as a Slurm queue of it (toolkit.cluster.queues)
    # ranks (and CPU threads per rank) share the CPUs the pod requests, not the whole node's
    target = Target(name=instance_type, instance=it, max_nodes=nodes, tasks_per_node=tasks,
                    cpus_per_task=max(1, pod_cpus(it) // tasks),
                    cpus_rule=f"{pod_cpus(it)} CPUs requested per pod / {tasks} ranks; a tenth of the node's "
                              f"{it.vcpus} vCPUs is left to its daemons",
                    fabric="modern" if use_efa else "none", shared_root=FSX_MOUNT)
    return target, it.efa_interfaces if use_efa else 0


def pod_cpus(it: InstanceType) -> int:
    return math.floor(it.vcpus * (1 - NODE_RESERVE))


def _check_input(recipe, it: InstanceType, profile: str | None) -> None:
    accel = family(it)  # a family the registry refuses stops here, in its words
    if not accel.kubernetes_form:
        raise HpcError(f"{it.name} is a {accel.label} instance: recipes have no {accel.label} form on Kubernetes "
                       "yet",
                       fix="choose an NVIDIA GPU instance (e.g. p4d.24xlarge, p5.48xlarge)")
    if accel.device == "cpu" and "cpu" not in recipe.resources.runs_on:
        raise HpcError(f"recipe {recipe.name} runs on GPUs only; {it.name} has no GPUs",
                       fix="choose a GPU instance with --instance (e.g. p4d.24xlarge, p5.48xlarge)")
    if recipe.prepare:
        which = f"profile {profile} of recipe {recipe.name}" if profile else f"recipe {recipe.name}"
        raise HpcError(f"{which} makes its data with `prepare` on the first node before the ranks start: that "
                       "step has no Kubernetes form (every pod would run it)",
                       fix="make the data on the FSx volume first and drop `prepare` (--set prepare=null)")


def _dns_name(text: str) -> str:
    return text.replace("_", "-").lower()[:63].rstrip("-")


def _device_resource(it: InstanceType) -> str:
    resource = family(it).kubernetes_resource
    if resource is None:  # a family without devices has no GPUs to request
        raise HpcError(f"{it.name} has no devices a pod can request", fix="request no GPUs on it")
    return resource


def resources(it: InstanceType, gpus: int, efa: int) -> dict:
    """A node-sized pod: every GPU and EFA device, huge pages for EFA, CPU/memory less the daemons' share."""
    requests: dict[str, Any] = {"cpu": str(pod_cpus(it)),
                                "memory": f"{math.floor(it.memory_gib * (1 - NODE_RESERVE))}Gi"}
    devices: dict[str, Any] = {}
    if gpus:
        devices[_device_resource(it)] = gpus
    if efa:
        devices[EFA] = efa
        devices[HUGEPAGES] = EFA_HUGEPAGES
    return {"requests": {**requests, **devices}, "limits": dict(devices)} if devices else {"requests": requests}


def shm_size(it: InstanceType) -> str:
    return f"{math.floor(it.memory_gib * (1 - NODE_RESERVE) * SHM_SHARE)}Gi"


def worker_command(spec) -> tuple[list[str], list[str]]:
    """A PyTorchJob worker's command and args: torchrun starting the rank program, or a launcher that is its own
    per-node agent (its pod prelude sets what its argv reads)."""
    from toolkit.job.rank import rank_program
    from toolkit.launchers import launcher_for

    prelude = launcher_for(spec.launcher).pod_prelude()
    if prelude is None:
        return ["torchrun"], torchrun_args(spec.command)
    program = rank_program(spec.command, 0, 0, contract=False, prelude=prelude)
    return ["bash"], as_written(["-c", program.script, *program.words])


def torchrun_args(command: tuple[Arg, ...]) -> list[str]:
    """torchrun's arguments for a JobSpec command: each worker's bash runs the command with its own values.

    torchrun reads its other settings (nodes, processes per node, rendezvous, restarts) from the PET_*
    variables the Training Operator sets from the PyTorchJob, and sets the rank contract for its workers: the
    rank program (toolkit.job.rank) needs to export none of it. A restart's fresh rendezvous port comes from
    torchrun itself (TORCHRUN_ENV in the pod's env), the same on every pod.
    """
    from toolkit.job.rank import rank_program

    program = rank_program(command, 0, 0, contract=False)
    return as_written(["--no-python", "bash", "-c", program.script, *program.words])


def as_written(words: list[str]) -> list[str]:
    """Container args and env values as Kubernetes passes them on: the kubelet reads `$(NAME)` in them as a
    variable reference and replaces it when NAME is in the container's env; `$$(` is a literal `$(`
    (k8s.io/kubernetes third_party/forked/golang/expansion)."""
    return [w.replace("$(", "$$(") for w in words]


# An MPI binary named by a relative path runs from the image, under this root: AWS's EKS nccl-tests image builds
# nccl-tests in /opt/nccl-tests against the image's NCCL, aws-ofi-nccl and Open MPI (aws-samples/
# awsome-distributed-training micro-benchmarks/nccl-tests/nccl-tests.Dockerfile); a build on the FSx volume, made
# on the Slurm cluster's AMI, would have to match the image's libraries.
IMAGE_SOFTWARE_ROOT = "/opt"
# The launcher's retries (runPolicy.backoffLimit becomes the launcher Job's): AWS's EKS nccl-tests MPIJob allows 20
# (micro-benchmarks/nccl-tests/kubernetes/nccl-tests.yaml). With the launcher created only once every worker is
# Ready (WaitForWorkersReady), they absorb what is left at 64 workers: a worker's DNS record or sshd not answering
# at the first attempt. A run that fails for good, or hangs on a bad fabric, ends at the recipe's time limit (the
# launcher Job's activeDeadlineSeconds, counted from its start: after the workers are Ready), as under Slurm.
LAUNCHER_BACKOFF_LIMIT = 20


def image_program(program: str) -> str:
    """Where an MPI binary of the recipe is in the image (an absolute path stays as given)."""
    return program if program.startswith("/") else f"{IMAGE_SOFTWARE_ROOT}/{program}"


def mpirun_args(spec, program: str) -> list[str]:
    """mpirun's arguments for an MPI binary (`program`, in the image): one rank per slot (GPU), the job's
    variables forwarded."""
    if any(not isinstance(a, str) for a in spec.command):
        raise HpcError(f"recipe {spec.recipe}: an MPI binary takes its rank from MPI, but its command has "
                       "per-rank values", fix="remove the per-rank values from the recipe's args")
    forwarded = [w for var in spec.env if not var.prepend for w in ("-x", var.name)]
    return ["--allow-run-as-root", "-np", str(spec.world_size), "--map-by", f"ppr:{spec.tasks_per_node}:node",
            "--bind-to", "none", "-x", "PATH", "-x", "LD_LIBRARY_PATH", *forwarded, program, *spec.command[1:]]


def _env(spec) -> list[dict]:
    # Not a path list to prepend (LD_LIBRARY_PATH): a pod's env can only replace the image's value, and the
    # image sets its own library path.
    return [{"name": var.name, "value": as_written([var.value])[0]} for var in spec.env if not var.prepend]


def torchrun_env(spec) -> list[dict]:
    """The job's variables, torchrun's (a rendezvous store per round, as under Slurm: toolkit.job.spec.TORCHRUN_ENV),
    and threads per rank: torchrun would set OMP_NUM_THREADS=1 for every worker, where a Slurm rank keeps its CPUs
    per task (our trainer reads SLURM_CPUS_PER_TASK, absent here)."""
    from toolkit.job.spec import TORCHRUN_ENV

    threads = [] if "OMP_NUM_THREADS" in spec.environ else [{"name": "OMP_NUM_THREADS",
                                                               "value": str(spec.cpus_per_task)}]
    return _env(spec) + [{"name": name, "value": value} for name, value in TORCHRUN_ENV] + threads


def _pod(spec, it: InstanceType, container: dict, claim: str | None, labels: dict, efa: int,
         script: PlacedScript | None = None) -> dict:
    gpus = spec.gpus_per_node
    container = {**container, "resources": resources(it, gpus, efa)}
    volumes: list[dict] = []
    mounts: list[dict] = []
    if claim:
        volumes.append({"name": "fsx", "persistentVolumeClaim": {"claimName": claim}})
        mounts.append({"name": "fsx", "mountPath": FSX_MOUNT})
    if script is not None and script.volume is not None and script.mount is not None:  # a ConfigMap's script
        volumes.append(script.volume)
        mounts.append(script.mount)
    volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(it)}})
    mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    container["volumeMounts"] = mounts
    pod: dict[str, Any] = {"nodeSelector": {INSTANCE_LABEL: it.name}}
    if gpus:
        pod["tolerations"] = [{"key": _device_resource(it), "operator": "Exists", "effect": "NoSchedule"}]
    pod["containers"] = [container]
    pod["volumes"] = volumes
    return {"metadata": {"labels": labels}, "spec": pod}


def _metadata(name: str, namespace: str, labels: dict) -> dict:
    return {"name": name, "namespace": namespace, "labels": labels}


def _labels(spec) -> dict:
    return {"app.kubernetes.io/managed-by": "hpc-toolkit", "hpc-toolkit/recipe": _dns_name(spec.recipe)}


def pytorch_job(spec, it: InstanceType, name: str, namespace: str, image: str, claim: str, efa: int,
                script: PlacedScript | None = None) -> dict:
    labels = _labels(spec)
    command, args = worker_command(spec)
    container = {"name": "pytorch", "image": image, "command": command, "args": args, "env": torchrun_env(spec)}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": _metadata(name, namespace, labels),
        "spec": {
            "nprocPerNode": str(spec.tasks_per_node),
            # min = max: the derived values (world size, update-freq, LR) hold for exactly this many nodes;
            # the elastic agent still replaces failed workers and restarts the group from its checkpoint.
            "elasticPolicy": {"rdzvBackend": "c10d", "minReplicas": spec.nodes, "maxReplicas": spec.nodes,
                              "maxRestarts": MAX_RESTARTS},
            "runPolicy": {"cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": {"Worker": {
                "replicas": spec.nodes, "restartPolicy": "OnFailure",
                "template": _pod(spec, it, container, claim, labels, efa, script)}},
        },
    }


def mpi_job(spec, it: InstanceType, name: str, namespace: str, image: str, claim: str, efa: int,
            program: str) -> dict:
    labels = _labels(spec)
    launcher = {"name": "launcher", "image": image, "command": ["mpirun"],
                "args": as_written(mpirun_args(spec, program)), "env": _env(spec),
                "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}
    worker = {"name": "worker", "image": image, "command": ["/usr/sbin/sshd"], "args": ["-De"]}
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": _metadata(name, namespace, labels),
        "spec": {
            "slotsPerWorker": spec.tasks_per_node,
            # mpirun starts only when every worker is Ready: workers still pulling a multi-GB image would be
            # unreachable (the default, AtStartup, starts the launcher at once)
            "launcherCreationPolicy": "WaitForWorkersReady",
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": LAUNCHER_BACKOFF_LIMIT,
                          "activeDeadlineSeconds": spec.time_limit_minutes * 60},
            "mpiImplementation": "OpenMPI",
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": "OnFailure",
                             "template": {"metadata": {"labels": labels}, "spec": {"containers": [launcher]}}},
                "Worker": {"replicas": spec.nodes, "template": _pod(spec, it, worker, claim, labels, efa)},
            },
        },
    }


def storage_documents(storage: Storage, namespace: str) -> list[dict]:
    """The StorageClass and claim for FSx for Lustre dynamic provisioning (none for an existing claim)."""
    if storage.storage_class is None:
        return []
    storage_class = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": storage.storage_class},
        "provisioner": FSX_PROVISIONER,
        "parameters": {
            "subnetId": FILL_IN + "a subnet id of the cluster's GPU nodes (subnet-...), in their Availability Zone>",
            "securityGroupIds": FILL_IN + "security group ids (sg-..., comma-separated) that allow Lustre "
                                          "traffic (TCP 988, 1018-1023) from the nodes>",
            "deploymentType": "PERSISTENT_2",
            "perUnitStorageThroughput": "250",
        },
        "reclaimPolicy": "Retain",
        "volumeBindingMode": "Immediate",
        "mountOptions": ["flock"],
    }
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": storage.claim, "namespace": namespace},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": storage.storage_class,
                 "resources": {"requests": {"storage": FSX_CAPACITY}}},
    }
    return [storage_class, claim]


def to_yaml(documents: list[dict], header: list[str]) -> str:
    """The documents as YAML that kubectl reads back as written (every string that any YAML reader could take
    for a number, boolean or null is quoted: toolkit.k8s.kubeyaml), under a comment header."""
    from toolkit.k8s.kubeyaml import dump_all

    return "".join(f"# {line}\n".replace("# \n", "#\n") for line in header) + "---\n" + dump_all(documents)


def per_rank(recipe):
    """The recipe with its Python started per rank (style script): on Kubernetes each pod's torchrun is its node's
    agent, which starts the rank program (a style torchrun recipe's own torchrun would start another under it)."""
    if recipe.launcher.style != "torchrun":
        return recipe
    return recipe.model_copy(update={"launcher": recipe.launcher.model_copy(update={"style": "script",
                                                                                   "max_restarts": 0})})


def _started_by_pod_torchrun(spec):
    """The spec saying how its ranks start here: the Slurm form's launcher value (srun per rank, or its own
    torchrun per node) is each pod's torchrun on Kubernetes."""
    from toolkit.job.scaling import Derived

    how = Derived("launcher", f"torchrun per pod, {spec.tasks_per_node} ranks each, max {MAX_RESTARTS} restarts",
                  "Kubernetes: the operator gives each pod's torchrun the job's rendezvous")
    return dataclasses.replace(spec, derived=tuple(how if d.key == "launcher" else d for d in spec.derived))


def _run_script_from(spec, local: str, path: str):
    """The spec whose program runs the script at `path` (the pods') instead of `local` (here)."""
    command = list(spec.command)
    command[command.index(local)] = path  # the program's word, before any argument
    return dataclasses.replace(spec, command=tuple(command))


def render(recipe, instance_type: str, nodes: int, *, profile: str | None = None, namespace: str = "default",
           image: str | None = None, storage: Storage = Storage(), efa: bool | None = None,
           command_line: str = "", api: str = V1, script_from: str | None = None,
           script_in_image: str | None = None) -> Rendered:
    """The manifests of `recipe` on `nodes` nodes of `instance_type` (all derived values from the JobSpec). A
    researcher's own script (Launcher.user_code) comes from the image, at `script_in_image` (default: the recipe's
    path), or from a ConfigMap: `script_from` (toolkit.k8s.usercode)."""
    from toolkit.job.spec import job_spec

    from toolkit.errors import UsageError
    from toolkit.launchers import launcher_of
    from toolkit.launchers.base import checked_script

    it = instance(instance_type)
    launcher = launcher_of(recipe.launcher)
    kind = launcher.kubernetes_kind(recipe)
    if api == TRAINER_V2 and launcher.pod_prelude() is not None:  # TrainJob's torch runtime prefixes torchrun's
        raise HpcError(f"recipe {recipe.name}: launcher kind {recipe.launcher.kind} is its own per-node agent: its "
                       "Kubernetes form is the v1 PyTorchJob (a Trainer v2 TrainJob runs torchrun)",
                       fix="add --api v1")
    _check_input(recipe, it, profile)
    code = launcher.user_code(recipe.launcher)
    if script_from is not None and (code is None or code[0] != "script"):
        raise UsageError(f"--script-from {script_from}: {launcher.what(recipe.launcher)} is no script of yours",
                         fix="leave out --script-from (it says where the pods read a script: SCRIPT.py, or a "
                             "recipe of launcher kind python-script)")
    target, efa_devices = k8s_target(instance_type, nodes, efa)
    torchrun = launcher.pod_prelude() is None
    spec = job_spec(per_rank(recipe) if torchrun else recipe, target, nodes, profile=profile)
    spec = _started_by_pod_torchrun(spec) if torchrun else spec
    if not spec.root.startswith(FSX_MOUNT + "/") and spec.root != FSX_MOUNT:
        raise HpcError(f"recipe {recipe.name}: its dirs are under {spec.root}, but the pods "
                       f"see only the FSx volume at {FSX_MOUNT}",
                       fix=f"put dirs.root under {FSX_MOUNT} (e.g. --set dirs.root={FSX_MOUNT}/{spec.recipe}), "
                           "or leave it unset")
    from toolkit.launchers import check_arguments

    notes = check_arguments(recipe, spec)  # the launcher's own parser, as for a Slurm plan (toolkit.submit.plan)
    if spec.spares:
        notes.append(f"resources.spares {spec.spares} is for Slurm (spare nodes held in the allocation): on "
                     "Kubernetes the operator recreates a failed pod on whatever node the scheduler gives it")
    name = _dns_name(spec.job_name)
    script = None
    if code is not None and code[0] == "script":
        local = checked_script(spec.root, code[1])
        script = place_script(local, script_from, image, script_in_image or code[1], name, namespace,
                              _labels(spec))
        spec = _run_script_from(spec, local, script.path)
        notes.append(script.note)
    elif code is not None:
        notes.append(f"the module {code[1]} comes from the image: {image or 'the image'} must hold it (installed, "
                     "or on its PYTHONPATH)")
    if image is None:
        image = FILL_IN + (f"an image with the EFA installer, aws-ofi-nccl, Open MPI, and "
                           f"{image_program(recipe.launcher.program or '')} built against them>" if kind == "MPIJob"
                           else "an image with torch, the EFA installer, aws-ofi-nccl and this recipe's software>")
        notes.append("no --image given: the manifest names a placeholder image to fill in")
    if storage.storage_class is None:
        notes.append(f"the data/checkpoint dirs are on the existing claim {storage.claim!r} mounted at {FSX_MOUNT}: "
                     "it must be ReadWriteMany (FSx for Lustre through fsx.csi.aws.com)")
    program_note = []
    if kind == "PyTorchJob":
        job = pytorch_job(spec, it, name, namespace, image, storage.claim, efa_devices, script)
    else:
        program = image_program(recipe.launcher.program or "")
        job = mpi_job(spec, it, name, namespace, image, storage.claim, efa_devices, program)
        program_note = [f"mpirun runs {program} from the image (built against the image's NCCL, aws-ofi-nccl and "
                        f"Open MPI), not {spec.command[0]}, the Slurm form's build."]
        notes += program_note
    jobs, what = [job], f"{kind} {name}"
    if api == TRAINER_V2:
        from toolkit.k8s.trainer_v2 import from_v1

        jobs = from_v1(job)
        what = f"TrainJob {name} ({'torch-distributed' if kind == 'PyTorchJob' else 'MPI'} runtime)"
    configmaps = [script.configmap] if script is not None and script.configmap is not None else []
    documents = storage_documents(storage, namespace) + configmaps + jobs
    header = [f"{what}: {recipe.description}",
              f"Rendered by `{command_line}` (do not edit: change the recipe and render again)." if command_line
              else "Rendered by hpc k8s render (do not edit: change the recipe and render again).",
              f"{spec.nodes} x {it.name}, {spec.tasks_per_node} ranks per node, world size {spec.world_size}; "
              f"{efa_devices} EFA devices per node.", *program_note, *([script.note] if script else []), "",
              "Derived values (the same JobSpec code as the Slurm form):"]
    header += [f"  {d.key} = {d.value}  ({d.rule})" for d in spec.derived]
    if spec.warnings:
        header += ["", "Warnings (as for the Slurm form):"] + [f"  {w}" for w in spec.warnings]
    if any(isinstance(v, str) and v.startswith(FILL_IN) for d in documents for v in _strings(d)):
        header += ["", "Values marked '<fill in: ...>' must be replaced before `kubectl apply`."]
    where = None if script is None else {
        "source": script.source, "path": script.path,
        "configmap": script.configmap["metadata"]["name"] if script.configmap is not None else None}
    return Rendered(spec, documents, to_yaml(documents, header), notes, where)


def _strings(node: Any):
    if isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)
    elif isinstance(node, str):
        yield node
