"""Recipe + target + nodes -> JobSpec: every resource, device and environment decision of a job, in one place.

job_spec() builds the scheduler-neutral spec in small steps, each a plain function: resources (device, nodes,
ranks, CPUs), arguments (scaling, device forms), dirs, the DeepSpeed file, the per-rank command (rank_command),
software and environment, advice. A target is a Slurm queue (queue_target) or a Kubernetes node type
(toolkit.k8s.manifests). The Slurm room adds what only Slurm needs as `spec.slurm` (toolkit.slurm.materialize:
build_job_spec, on_slurm), which its script renderer and submitit executor read. Its per-rank
command is a tuple of Args: literal strings, or RankVars (values only known inside each task), or tuples of
both concatenated (`("tcp://", MASTER_ADDR, ":", MASTER_PORT)`). No user value is ever a template:
every rank's bash expands them from the rank contract (toolkit.job.rank.rank_program), on both submission paths.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Mapping

from toolkit.accelerators import family, of_device
from toolkit.catalog import InstanceType
from toolkit.cluster.queues import Queue
from toolkit.errors import HpcError
from toolkit.job.advice import advise
from toolkit.job.container import ContainerEnv, prelude, resolve
from toolkit.job.env import EnvVar, heartbeat_env, job_env
from toolkit.job.rank import Arg, RankProgram, RankVar, rank_program
from toolkit.job.resume import checkpoint_repair_script
from toolkit.job.scaling import Derived, apply_scaling
from toolkit.job.shell import export_line
from toolkit.recipes.schema import Recipe, flag_words

if TYPE_CHECKING:
    from toolkit.slurm.part import SlurmPart

FAIRSEQ_HALF_PRECISION = ("--fp16", "--bf16", "--memory-efficient-fp16", "--memory-efficient-bf16", "--amp")
FAIRSEQ_DISTRIBUTED = ("--distributed-world-size", "--distributed-rank", "--device-id", "--distributed-init-method",
                       "--distributed-backend", "--distributed-no-spawn", "--distributed-port", "--cpu")
TRAINER_DEVICE = ("--device", "--backend", "--threads")  # our trainers' (toolkit.workloads) device flags
GPU_LOADERS = ("gpu", "dali")  # the ResNet trainer's --loader values that need CUDA (toolkit.workloads.resnet_loaders)


LauncherKind = Literal["fairseq", "python-module", "python-script", "binary", "deepspeed"]
LauncherStyle = Literal["script", "torchrun"]
OUR_TRAINERS = "toolkit.workloads."  # modules that take TRAINER_DEVICE flags (a user's module gets none)
USER_MAIN = Path(__file__).with_name("user_main.py")  # each Python rank's first code (`python -c`)
# torchrun with SIGUSR2 ignored: Slurm signals every process of the step before the time limit, and USR2's default
# action would kill torchrun (and with it the ranks) while they save. Ranks inherit the ignore; a workload that stops
# on the signal installs its own handler (our trainers), any other resumes from its checkpoint after the requeue.
# torchrun's environment on every target (Slurm here, the pods' container env in toolkit.k8s): each rendezvous round
# gets its own store. By default (torch >= 2.4) the workers share the agent's store, which outlives rounds, and tell
# restarts apart by TORCHELASTIC_RESTART_COUNT, which only the agent whose worker failed increments: after a failure
# the nodes' workers disagree and hang (pytorch/pytorch#135712; measured on torch 2.14.1). With the shared store off,
# rank 0's agent picks a free MASTER_PORT each round and every agent reads it from that round's rendezvous store
# (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py, next_rendezvous), so all nodes agree.
TORCHRUN_ENV = (("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"),)
TORCHRUN = (f"import os, signal, sys; os.environ.update({dict(TORCHRUN_ENV)!r}); "
            "signal.signal(signal.SIGUSR2, signal.SIG_IGN); from torch.distributed.run import main; sys.exit(main())")


@dataclasses.dataclass(frozen=True)
class SoftwareEnv:
    """How the nodes activate the training environment (absolute paths)."""

    modules: tuple[str, ...] = ()
    venv: str | None = None
    conda_root: str | None = None
    conda_env: str | None = None
    container: ContainerEnv | None = None  # every rank runs in it (toolkit.job.container); the rest inside it


@dataclasses.dataclass(frozen=True)
class JobFile:
    """A file the job's set-up writes before the ranks start (e.g. the generated DeepSpeed config)."""

    path: str
    text: str
    doc: str


@dataclasses.dataclass(frozen=True)
class JobSpec:
    job_name: str
    recipe: str
    profile: str | None
    partition: str
    instance_type: str
    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    cpus_per_task: int
    threads_per_rank: int | None  # OMP_NUM_THREADS / --threads on CPU queues; None leaves libraries' defaults
    time_limit: str
    exclusive: bool
    launcher: LauncherKind
    mpi: str | None  # srun --mpi=<this> for MPI binaries (nccl-tests)
    stops_on_signal: bool  # the workload saves and exits 75 on SIGUSR2 (else it resumes from its last checkpoint)
    requeue: bool  # False for benchmarks: no signal before the time limit, no requeue (recipe resources.requeue)
    signal_before_s: int  # SIGUSR2 this long before the time limit, then the job requeues itself
    software: SoftwareEnv
    env: tuple[EnvVar, ...]
    command: tuple[Arg, ...]
    prepare: tuple[str, ...]  # run once on the first node before the ranks: makes the data if missing
    root: str  # the dirs root: relative recipe paths resolve under it
    run_dir: str
    derived: tuple[Derived, ...]
    warnings: tuple[str, ...] = ()  # toolkit.job.advice: the job will not do what its flags suggest
    files: tuple[JobFile, ...] = ()
    dirs: Mapping[str, str] = dataclasses.field(default_factory=dict)  # data / checkpoints / logs, as resolved
    style: LauncherStyle = "script"  # torchrun: one Slurm task per node starts that node's tasks_per_node ranks
    hang_timeout_s: int | None = None  # resources.hang_timeout_s: the watchdog ends a job stalled this long
    spares: int = 0  # resources.spares: nodes held beyond `nodes` to restart on (toolkit.node.spares)
    preflight: bool = False  # check every node before the ranks start (resources.preflight; toolkit.node.preflight)
    slurm: SlurmPart | None = None  # what only Slurm needs (toolkit.slurm.materialize): None until planned there

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def program(self) -> RankProgram:
        """What srun starts on every Slurm task, on every submission path (toolkit.job.rank)."""
        # The heartbeat dir is the run dir's: per task of a sweep, so in the rank program, not in the shared batch
        # script's set-up (the recipe's env.HPC_HEARTBEAT_DIR, if any, wins). With spares the supervisor watches for
        # hangs and ends only the step (toolkit.node.spares), not rank 0's watchdog, which would end the job.
        hang_timeout = None if self.spares else self.hang_timeout_s
        bundle = self.slurm.node_bundle if self.slurm else None
        heartbeats = "; ".join(export_line(var) for var in heartbeat_env(self.run_dir, hang_timeout, bundle)
                               if var.prepend or var.name not in self.environ)
        container = prelude(self.software, self.env) if self.software.container else ""
        resume = checkpoint_repair_script(self.launcher, self.dirs.get("checkpoints"))
        return rank_program(self.command, self.world_size, self.tasks_per_node, contract=self.style == "script",
                            prelude="; ".join(part for part in (heartbeats, container, resume) if part))

    @property
    def environ(self) -> dict[str, str]:
        return {var.name: var.value for var in self.env}

    @property
    def time_limit_minutes(self) -> int:
        return time_minutes(self.time_limit)


def time_minutes(text: str) -> int:
    """Slurm --time (MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]) in whole minutes, rounded up."""
    days, dash, rest = text.partition("-")
    if not dash:
        days, rest = "0", days
    parts = [int(p) for p in rest.split(":")]
    if dash:
        hours, minutes, seconds = (parts + [0, 0])[:3]
    else:
        hours, minutes, seconds = {1: (0, parts[0], 0), 2: (0, *parts), 3: tuple(parts)}[len(parts)]
    total = ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    return -(-total // 60)


def _under(root: str, path: str) -> str:
    return path if path.startswith("/") else f"{root}/{path}"


def _device_forms(flags: Literal["fairseq", "trainer"] | None, args: dict, device: str, threads: int | None,
                  world: int) -> tuple[dict, list[Derived]]:
    """The recipe's args in the queue's device form (its accelerator family's device and collective backend; CPU:
    gloo, no half precision), for fairseq and our trainers; other programs' args are left as written."""
    args = dict(args)
    accel = of_device(device)
    on_cpu = device == "cpu"
    why = f"{device.upper()} queue"
    derived: list[Derived] = []

    def put(flag: str, value, reason: str) -> None:
        args[flag] = value
        derived.append(Derived(flag, "set" if value is True else str(value), f"{why}: {reason}"))

    def drop(flags: tuple[str, ...], reason: str) -> None:
        for flag in flags:
            if args.pop(flag, None) is not None:
                derived.append(Derived(flag, "removed", f"{why}: {reason}"))

    if flags == "fairseq":
        if not accel.runs_fairseq:
            raise HpcError(f"fairseq has no {accel.label} support", fix="run fairseq recipes on a GPU or CPU queue")
        if on_cpu:
            drop(FAIRSEQ_HALF_PRECISION, "no half precision on CPU")
            put("--cpu", True, "train on CPU")
        put("--distributed-backend", accel.collective, accel.collective_why)
        if on_cpu:
            put("--ddp-backend", "legacy_ddp", "pytorch_ddp/c10d pass GPU device_ids and fail on CPU")
        put("--distributed-world-size", world, "world size = nodes x ranks per node")
        put("--distributed-no-spawn", True, "srun starts one process per rank; fairseq must not spawn more")
    elif flags == "trainer":
        loader = args.get("--loader")
        if loader in GPU_LOADERS and accel.torch_device != "cuda":  # said here, not by every rank (resnet_loaders)
            raise HpcError(f"--loader {loader} decodes JPEGs on a CUDA GPU, which this queue does not have ({why})",
                           fix="use --loader pil there (--set args.--loader=pil, or leave out --profile gpu-data), "
                               "or choose a GPU queue")
        if on_cpu:
            drop(("--amp",), "no mixed precision on CPU")
        put("--device", accel.torch_device, accel.torch_device_why)
        put("--backend", accel.collective, accel.collective_why)
        if on_cpu:
            put("--threads", threads, "torch threads = CPUs per task (oversubscription costs 2-3x)")
    return args, derived


@dataclasses.dataclass(frozen=True)
class Target:
    """The nodes a job runs on, as the spec needs them: a Slurm queue (queue_target) or a Kubernetes node type
    (toolkit.k8s.manifests.k8s_target). Nothing here belongs to one scheduler."""

    name: str  # the queue (Slurm partition) or node type, as messages name it
    instance: InstanceType
    max_nodes: int
    tasks_per_node: int
    cpus_per_task: int
    cpus_rule: str  # why each rank gets cpus_per_task CPUs
    fabric: str  # the EFA/NCCL stack the nodes set up (toolkit.job.env)
    shared_root: str | None  # the shared file system every node mounts (FSx), if any


def queue_target(queue: Queue) -> Target:
    return Target(name=queue.name, instance=queue.instance, max_nodes=queue.max_nodes,
                  tasks_per_node=queue.tasks_per_node, cpus_per_task=queue.cpus_per_task,
                  cpus_rule=queue.cpus_rule,
                  fabric=queue.fabric, shared_root=queue.fsx_mount)


@dataclasses.dataclass(frozen=True)
class Resources:
    device: str  # the accelerator family's device form (toolkit.accelerators.base.Device)
    nodes: int
    tasks: int  # ranks per node
    cpus: int  # CPUs per rank
    threads: int | None  # threads per rank on CPU queues
    gpus: int  # GPUs per node: Slurm GRES (Family.slurm_gres; other devices get one rank each instead)
    derived: tuple[Derived, ...]

    @property
    def world(self) -> int:
        return self.nodes * self.tasks


def resources(recipe: Recipe, target: Target, nodes: int | None) -> Resources:
    """Device, nodes (the recipe's resources.nodes when None), ranks and CPUs per node, checked against the target."""
    instance = target.instance
    accel = family(instance, instance.name if target.name == instance.name else f"queue {target.name} "
                                                                                  f"({instance.name})")
    device = accel.device
    if device not in recipe.resources.runs_on:
        raise HpcError(f"recipe {recipe.name} runs on {' or '.join(recipe.resources.runs_on)} only; queue "
                       f"{target.name} ({instance.name}) has {accel.has}",
                       fix="choose another queue with --cluster FILE --queue Q")
    nodes = nodes or recipe.resources.nodes
    if nodes > target.max_nodes:
        raise HpcError(f"{nodes} nodes requested; queue {target.name} has at most {target.max_nodes}",
                       fix=f"use --nodes 1..{target.max_nodes} or a bigger queue")
    tasks, cpus = target.tasks_per_node, target.cpus_per_task
    return Resources(device, nodes, tasks, cpus, None if device != "cpu" else cpus,
                     instance.gpus if accel.slurm_gres else 0, (
        Derived("ranks per node", str(tasks), f"one per {device.upper()} ({instance.gpus} x {instance.gpu_model})"
                if device != "cpu" else f"queue {target.name} declares {tasks} ranks per node (CPU queue)"),
        Derived("world size", str(nodes * tasks), f"{nodes} nodes x {tasks} ranks per node"),
        Derived("cpus per task", str(cpus), target.cpus_rule),
    ))


def _flag_style(recipe: Recipe) -> Literal["fairseq", "trainer"] | None:
    """Whose device flags the toolkit sets: fairseq's, our trainers' (toolkit.workloads), or none."""
    if recipe.launcher.kind == "fairseq":
        return "fairseq"
    ours = recipe.launcher.kind == "python-module" and (recipe.launcher.module or "").startswith(OUR_TRAINERS)
    return "trainer" if ours else None


def arguments(recipe: Recipe, target: Target, res: Resources) -> tuple[dict, list[Derived]]:
    """The recipe's args scaled to the world size and put in the target's device form."""
    style = _flag_style(recipe)
    for flag in {"fairseq": FAIRSEQ_DISTRIBUTED, "trainer": TRAINER_DEVICE, None: ()}[style]:
        if flag in recipe.args:
            raise HpcError(f"recipe {recipe.name}: args.{flag} is set by the toolkit from the queue",
                           fix=f"remove {flag} from the recipe (or --set args.{flag}=null)")
    args, scaled = apply_scaling(recipe.scaling, recipe.args, nodes=res.nodes, ranks_per_node=res.tasks,
                                 max_nodes=target.max_nodes,
                                 gpu_memory_gib=target.instance.gpu_memory_gib if res.device != "cpu" else None,
                                 cpus_per_rank=res.cpus)
    args, forms = _device_forms(style, args, res.device, res.threads, res.world)
    return args, scaled + forms


def dirs_root(recipe: Recipe, target: Target) -> tuple[str, Derived]:
    """Where relative recipe paths resolve: the recipe's dirs.root, else the target's shared file system, else here."""
    root = recipe.dirs.root and os.path.abspath(recipe.dirs.root) or target.shared_root or os.getcwd()
    return root, Derived("dirs root", root, "dirs.root of the recipe" if recipe.dirs.root else
                         f"queue {target.name}'s FSx mount" if target.shared_root else
                         "no FSx mount on the queue: the current directory")


@dataclasses.dataclass(frozen=True)
class Dirs:
    run_dir: str
    paths: dict[str, str]  # data / checkpoints / logs, as set
    positional: tuple[str, ...]  # dirs passed as positional arguments
    args: dict[str, str]  # dirs passed as flags
    derived: tuple[Derived, ...]


def dirs(recipe: Recipe, root: str, job_name: str, run_dir: str | None) -> Dirs:
    """The run dir and the recipe's data/checkpoint/log dirs under it or the root. Slurm's run dir is always given
    (toolkit.submit.plan.plan_job); <root>/runs/<job> is for targets with no runs root of their own (Kubernetes)."""
    derived: list[Derived] = []
    run_dir = run_dir or f"{root}/runs/{job_name}"
    paths: dict[str, str] = {}
    positional: list[str] = []
    args: dict[str, str] = {}
    for name in ("data", "checkpoints", "logs"):
        entry = getattr(recipe.dirs, name)
        if entry is None:
            continue
        base, where = (run_dir, "the run dir") if entry.under == "run" else (root, "the dirs root")
        path = paths[name] = _under(base, entry.dir)
        derived.append(Derived(f"{name} dir", path, f"dirs.{name}.dir under {where}" if path != entry.dir
                               else f"dirs.{name}.dir (absolute)"))
        if entry.arg == "positional":
            positional.append(path)
        elif entry.arg:
            args[entry.arg] = path
    return Dirs(run_dir, paths, tuple(positional), args, tuple(derived))


def deepspeed_file(recipe: Recipe, target: Target, res: Resources,
                   run_dir: str) -> tuple[tuple[JobFile, ...], dict, list[Derived]]:
    """The DeepSpeed config the job's set-up writes into the run dir, and the args that point at it."""
    if recipe.deepspeed is None:
        return (), {}, []
    from toolkit.job.deepspeed import deepspeed_parts

    path = f"{run_dir}/deepspeed.json"
    text, args, derived = deepspeed_parts(recipe.deepspeed, path, nodes=res.nodes, ranks_per_node=res.tasks,
                                          max_nodes=target.max_nodes)
    return (JobFile(path, text, f"the DeepSpeed config generated from recipe {recipe.name} (deepspeed: section) "
                                f"for {res.world} ranks"),), args, derived


def prepare_step(recipe: Recipe, data_dir: str | None) -> tuple[str, ...]:
    """The recipe's data-making command with the data dir as its last argument (none without `prepare`)."""
    if not recipe.prepare:
        return ()
    if data_dir is None:
        raise HpcError(f"recipe {recipe.name}: `prepare` makes the data, but dirs.data is not set",
                       fix="set dirs.data.dir (where the data goes), or remove `prepare`")
    return (*recipe.prepare, data_dir)


def rank_command(recipe: Recipe, root: str, nodes: int, tasks: int, positional: tuple[str, ...],
                 args: dict) -> tuple[list[Arg], list[Derived]]:
    """The per-rank command: the launcher's program, the positional dirs, then every arg as flags."""
    ours = _flag_style(recipe) == "trainer"
    derived: list[Derived] = []
    launcher = recipe.launcher
    program: list[Arg]
    if launcher.kind in ("python-module", "python-script") and not (ours and launcher.style == "script"):
        program, how = _python_program(launcher, root, nodes, tasks)
        derived.append(how)
    else:  # one process per rank under srun, reading the rank contract (toolkit.job.rank): our trainers, DeepSpeed
        programs: dict[str, list[Arg]] = {
            "fairseq": ["fairseq-train"], "python-module": ["python", "-m", launcher.module or ""],
            "binary": [_under(root, launcher.program or "")],
            "deepspeed": ["python", _under(root, launcher.script or "")]}
        program = programs[launcher.kind]
    command: list[Arg] = [*program, *positional]
    for flag, value in args.items():
        command += flag_words(flag, value)
    if launcher.kind == "fairseq":  # explicit rendezvous: fairseq's own Slurm auto-detection is unsafe
        command += ["--distributed-rank", RankVar.RANK, "--device-id", RankVar.LOCAL_RANK,
                    "--distributed-init-method", ("tcp://", RankVar.MASTER_ADDR, ":", RankVar.MASTER_PORT)]

    return command, derived


def software_env(recipe: Recipe, root: str, run_dir: str) -> SoftwareEnv:
    """The recipe's software with its paths resolved under the dirs root (a container also mounts the run dir)."""
    software = recipe.software
    return SoftwareEnv(modules=tuple(software.modules), venv=software.venv and _under(root, software.venv),
                       conda_root=software.conda_root and _under(root, software.conda_root),
                       conda_env=software.conda_env,
                       container=resolve(software.container, root, run_dir) if software.container else None)


def job_spec(recipe: Recipe, target: Target, nodes: int | None = None, *, profile: str | None = None,
             run_dir: str | None = None) -> JobSpec:
    """The scheduler-neutral job for `recipe` on `nodes` nodes of `target`; build_job_spec adds Slurm's part."""
    res = resources(recipe, target, nodes)
    job_name = recipe.name if profile is None else f"{recipe.name}-{profile}"
    root, root_rule = dirs_root(recipe, target)
    args, derived = arguments(recipe, target, res)
    where = dirs(recipe, root, job_name, run_dir)
    args.update(where.args)
    files, ds_args, ds_derived = deepspeed_file(recipe, target, res, where.run_dir)
    args.update(ds_args)
    prepare = prepare_step(recipe, where.paths.get("data"))
    command, launch = rank_command(recipe, root, res.nodes, res.tasks, where.positional, args)
    advice, warnings = advise(recipe.launcher.kind, args, recipe.scaling, where.paths.get("data"), res.world)
    launcher = recipe.launcher
    return JobSpec(
        job_name=job_name, recipe=recipe.name, profile=profile, partition=target.name,
        instance_type=target.instance.name, nodes=res.nodes, tasks_per_node=res.tasks,
        gpus_per_node=res.gpus, cpus_per_task=res.cpus,
        threads_per_rank=res.threads, time_limit=recipe.resources.time, exclusive=recipe.resources.exclusive,
        launcher=launcher.kind, mpi=launcher.mpi, stops_on_signal=launcher.stops_on_signal,
        requeue=recipe.resources.requeue, signal_before_s=recipe.resources.signal_before_s,
        software=software_env(recipe, root, where.run_dir),
        env=job_env(target.instance, target.fabric, threads_per_rank=res.threads, launcher_kind=launcher.kind,
                    recipe_env=recipe.env, recipe_name=recipe.name,
                    library_dirs=[_under(root, d) for d in recipe.software.library_path],
                    nccl_home=recipe.software.nccl_home and _under(root, recipe.software.nccl_home)),
        command=tuple(command), prepare=prepare, root=root, run_dir=where.run_dir,
        derived=(*res.derived, root_rule, *derived, *where.derived, *ds_derived, *launch, *advice),
        warnings=tuple(warnings), files=files, dirs=where.paths, style=launcher.style,
        hang_timeout_s=recipe.resources.hang_timeout_s, spares=recipe.resources.spares,
        preflight=(recipe.resources.preflight if recipe.resources.preflight is not None
                   else recipe.resources.requeue and recipe.software.container is None),
    )


def _python_program(launcher, root: str, nodes: int, tasks: int) -> tuple[list[Arg], Derived]:
    """A Python launcher's argv up to its args: toolkit.job.user_main run by `python -c` (the rank environment,
    the import check, the rendezvous timeout), started per rank by srun or per node by torchrun. torchrun's
    endpoint (the first node, MASTER_ADDR:MASTER_PORT) and id (the job id) come from the job's set-up
    (PET_RDZV_ENDPOINT, PET_RDZV_ID: torchrun's own variables), so the whole argv is literal."""
    if launcher.kind == "python-script":
        script = _under(root, launcher.script)
        if not os.path.isfile(script):
            raise HpcError(f"script {script} does not exist" + ("" if launcher.script.startswith("/") else
                                                                 f" (launcher.script {launcher.script} under {root})"),
                           fix="give the path of an existing .py file on the file system the nodes share")
        target = [os.path.abspath(script)]
    else:
        target = ["-m", launcher.module]
    text = USER_MAIN.read_text()
    code = text[text.index('"""', 3) + 3:].lstrip()  # without the module's docstring (the contract)
    user_main = ["python", "-c", code, str(launcher.rendezvous_timeout_s), *target, *launcher.argv]
    if launcher.style == "script":
        return user_main, Derived("launcher", "srun: one process per rank", "style script")
    torchrun: list[Arg] = [
        "python", "-c", TORCHRUN, "--nnodes", str(nodes), "--nproc-per-node", str(tasks),
        "--rdzv-backend", "c10d", "--rdzv-conf", f"join_timeout={launcher.rendezvous_timeout_s}",
        "--max-restarts", str(launcher.max_restarts), "--no-python"]
    return [*torchrun, *user_main], Derived(
        "launcher", f"torchrun per node, {tasks} ranks each, max {launcher.max_restarts} restarts",
        "style torchrun: c10d rendezvous on the first node, the job id as rendezvous id")
