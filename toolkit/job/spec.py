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
from typing import TYPE_CHECKING, Literal, Mapping

from toolkit.accelerators import family
from toolkit.catalog import InstanceType
from toolkit.cluster.queues import Queue
from toolkit.errors import HpcError
from toolkit.job.advice import advise
from toolkit.job.container import ContainerEnv, prelude, resolve
from toolkit.job.env import EnvVar, heartbeat_env, job_env
from toolkit.job.rank import Arg, RankProgram, rank_program
from toolkit.job.scaling import Derived, apply_scaling
from toolkit.job.shell import export_line
from toolkit.launchers import launcher_for, launcher_of
from toolkit.launchers.base import under as _under
from toolkit.launchers.torchrun import TORCHRUN, TORCHRUN_ENV, USER_MAIN  # noqa: F401 (re-exported)
from toolkit.node.gate import wait_script
from toolkit.node.stop import StopPolicy
from toolkit.recipes.schema import Recipe, dir_under, flag_words

if TYPE_CHECKING:
    from toolkit.slurm.part import SlurmPart

LauncherKind = str  # the recipe's launcher.kind: toolkit.launchers.KINDS
LauncherStyle = Literal["script", "torchrun"]


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
    resume_from: str | None = None  # another run's checkpoints dir, copied into this one's once (--resume-from)
    slurm: SlurmPart | None = None  # what only Slurm needs (toolkit.slurm.materialize): None until planned there

    @property
    def stop(self) -> StopPolicy:
        """What the job does when Slurm says stop, on every path (toolkit.node.stop)."""
        return StopPolicy(requeue=self.requeue, saves_on_signal=self.stops_on_signal, before_s=self.signal_before_s)

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
        launcher = launcher_for(self.launcher)
        resume = launcher.resume_script(self.dirs.get("checkpoints"))
        # first of all, the wait for the pre-flight's verdict where the ranks start beside it
        gate = wait_script() if self.preflight_beside_ranks else ""
        return rank_program(self.command, self.world_size, self.tasks_per_node, contract=self.style == "script",
                            prelude="; ".join(part for part in (gate, heartbeats, container, launcher.rank_prelude(),
                                                                resume) if part))

    @property
    def preflight_beside_ranks(self) -> bool:
        """The ranks' step starts beside the pre-flight, its ranks waiting at its gate (toolkit.node.gate): every
        job planned with a pre-flight, but one with spares, whose supervisor starts its rounds from the verdict."""
        return bool(self.slurm and self.slurm.preflight_args) and not self.spares

    @property
    def environ(self) -> dict[str, str]:
        return {var.name: var.value for var in self.env}

    @property
    def time_limit_minutes(self) -> int:
        return time_minutes(self.time_limit)


def time_minutes(text: str) -> int:
    """Slurm --time (MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]) in whole minutes, rounded up."""
    return -(-time_seconds(text) // 60)


def time_seconds(text: str) -> int:
    """Slurm --time (MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]) in seconds."""
    days, dash, rest = text.partition("-")
    if not dash:
        days, rest = "0", days
    parts = [int(p) for p in rest.split(":")]
    if dash:
        hours, minutes, seconds = (parts + [0, 0])[:3]
    else:
        hours, minutes, seconds = {1: (0, parts[0], 0), 2: (0, *parts), 3: tuple(parts)}[len(parts)]
    return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds


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


def arguments(recipe: Recipe, target: Target, res: Resources) -> tuple[dict, list[Derived]]:
    """The recipe's args scaled to the world size and put in the target's device form (the launcher's)."""
    launcher = launcher_of(recipe.launcher)
    for flag in launcher.owned_flags:
        if flag in recipe.args:
            raise HpcError(f"recipe {recipe.name}: args.{flag} is set by the toolkit from the queue",
                           fix=f"remove {flag} from the recipe (or --set args.{flag}=null)")
    args, scaled = apply_scaling(recipe.scaling, recipe.args, nodes=res.nodes, ranks_per_node=res.tasks,
                                 max_nodes=target.max_nodes,
                                 gpu_memory_gib=target.instance.gpu_memory_gib if res.device != "cpu" else None,
                                 cpus_per_rank=res.cpus)
    args, forms = launcher.device_args(args, res.device, res.threads, res.world)
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
        under = dir_under(name, entry)
        base, where = (run_dir, "the run dir") if under == "run" else (root, "the dirs root")
        path = paths[name] = _under(base, entry.dir)
        why = (f"dirs.{name}.dir (absolute)" if path == entry.dir else
               f"dirs.{name}.dir under {where}" + (": each run its own" if entry.under is None and under == "run"
                                                  else ""))
        derived.append(Derived(f"{name} dir", path, why))
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


def rank_command(recipe: Recipe, root: str, nodes: int, tasks: int, positional: tuple[str, ...], args: dict,
                 device: str = "gpu", threads: int | None = None) -> tuple[list[Arg], list[Derived]]:
    """The per-rank command: the launcher's program, the positional dirs, every arg as flags, the launcher's
    trailer."""
    launcher = launcher_of(recipe.launcher)
    program, derived = launcher.program(recipe.launcher, root, nodes, tasks, device, threads)
    command: list[Arg] = [*program, *positional]
    for flag, value in args.items():
        command += flag_words(flag, value)
    return [*command, *launcher.trailer()], derived


def software_env(recipe: Recipe, root: str, run_dir: str) -> SoftwareEnv:
    """The recipe's software with its paths resolved under the dirs root (a container also mounts the run dir)."""
    software = recipe.software
    return SoftwareEnv(modules=tuple(software.modules), venv=software.venv and _under(root, software.venv),
                       conda_root=software.conda_root and _under(root, software.conda_root),
                       conda_env=software.conda_env,
                       container=resolve(software.container, root, run_dir) if software.container else None)


def heartbeat_warnings(recipe: Recipe) -> list[str]:
    """A hang timeout works from the ranks' heartbeats: a program that writes none never shows a hang (a fault
    probe stopped a rank of one for 35 s past its 15 s timeout, and nothing happened)."""
    from toolkit.launchers.trainer import BEATING_WORKLOADS

    timeout, launcher = recipe.resources.hang_timeout_s, recipe.launcher
    if not timeout or (launcher.kind == "python-module" and launcher.module in BEATING_WORKLOADS):
        return []
    return [f"the hang timeout ({timeout} s) works from the ranks' heartbeats, and hpc knows of none that "
            f"{recipe.name}'s program writes: unless it calls beat(step) each step (`from hpc_node.heartbeat "
            "import beat`: docs/resilience.md), no hang is ever seen"]


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
    command, launch = rank_command(recipe, root, res.nodes, res.tasks, where.positional, args, res.device, res.threads)
    advice, warnings = advise(launcher_of(recipe.launcher), args, recipe.scaling, where.paths.get("data"), res.world)
    warnings = [*warnings, *heartbeat_warnings(recipe)]
    launcher = recipe.launcher
    return JobSpec(
        job_name=job_name, recipe=recipe.name, profile=profile, partition=target.name,
        instance_type=target.instance.name, nodes=res.nodes, tasks_per_node=res.tasks,
        gpus_per_node=res.gpus, cpus_per_task=res.cpus,
        threads_per_rank=res.threads, time_limit=recipe.resources.time, exclusive=recipe.resources.exclusive,
        launcher=launcher.kind, mpi=launcher.mpi, stops_on_signal=launcher.stops_on_signal,
        requeue=recipe.resources.requeue, signal_before_s=recipe.resources.signal_before_s,
        software=software_env(recipe, root, where.run_dir),
        env=job_env(target.instance, target.fabric, threads_per_rank=res.threads,
                    launcher_env=launcher_of(launcher).env(),
                    recipe_env=recipe.env, recipe_name=recipe.name,
                    env_origins={name: origin for name in recipe.env if (origin := recipe.origin(("env", name)))},
                    library_dirs=[_under(root, d) for d in recipe.software.library_path],
                    nccl_home=recipe.software.nccl_home and _under(root, recipe.software.nccl_home)),
        command=tuple(command), prepare=prepare, root=root, run_dir=where.run_dir,
        derived=(*res.derived, root_rule, *derived, *where.derived, *ds_derived, *launch, *advice),
        warnings=tuple(warnings), files=files, dirs=where.paths, style=launcher_of(launcher).style(launcher),
        hang_timeout_s=recipe.resources.hang_timeout_s, spares=recipe.resources.spares,
        preflight=(recipe.resources.preflight if recipe.resources.preflight is not None
                   else recipe.resources.requeue and recipe.software.container is None),
    )
