"""Recipe + queue + nodes -> JobSpec: every resource, device and environment decision of a job, in one place.

The JobSpec is what both the sbatch renderer (toolkit.job.render) and the submitit path consume. Its per-rank
command is a tuple of Args: literal strings, or RankVars (values only known inside each task), or tuples of
both concatenated (`("tcp://", MASTER_ADDR, ":", MASTER_PORT)`). No user value is ever a template:
every rank's bash expands them from the rank contract (toolkit.job.rank.rank_program), on both submission paths.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path
from typing import Literal

from toolkit.cluster.queues import Queue
from toolkit.errors import HpcError
from toolkit.job.advice import fairseq_run_length, large_batch
from toolkit.job.env import EnvVar, job_env
from toolkit.job.rank import Arg, RankProgram, RankVar, rank_program
from toolkit.recipes.scaling import Derived, apply_scaling
from toolkit.recipes.schema import Recipe, flag_words

# Values that reach `#SBATCH` lines, which sbatch (not the shell) parses: no quoting can make a newline safe
# there (it would end the comment and start a shell command), so such values are restricted instead.
DIRECTIVE_SAFE = re.compile(r"^[A-Za-z0-9_.:,+=@%/?-]+$")

FAIRSEQ_HALF_PRECISION = ("--fp16", "--bf16", "--memory-efficient-fp16", "--memory-efficient-bf16", "--amp")
FAIRSEQ_DISTRIBUTED = ("--distributed-world-size", "--distributed-rank", "--device-id", "--distributed-init-method",
                       "--distributed-backend", "--distributed-no-spawn", "--distributed-port", "--cpu")
TRAINER_DEVICE = ("--device", "--backend", "--threads")  # our trainers' (toolkit.workloads) device flags


LauncherKind = Literal["fairseq", "python-module", "python-script", "binary", "deepspeed"]
LauncherStyle = Literal["script", "torchrun"]
OUR_TRAINERS = "toolkit.workloads."  # modules that take TRAINER_DEVICE flags (a user's module gets none)
USER_MAIN = Path(__file__).with_name("user_main.py")  # each Python rank's first code (`python -c`)
# torchrun with SIGUSR2 ignored: Slurm signals every process of the step before the time limit, and USR2's default
# action would kill torchrun (and with it the ranks) while they save. Ranks inherit the ignore; a workload that stops
# on the signal installs its own handler (our trainers), any other resumes from its checkpoint after the requeue.
TORCHRUN = ("import signal, sys; signal.signal(signal.SIGUSR2, signal.SIG_IGN); "
            "from torch.distributed.run import main; sys.exit(main())")
# The catalog's accelerator kind decides the device form of a job (GRES GPUs, devices, collective backend).
DEVICE_OF_ACCELERATOR = {"nvidia": "gpu", "gaudi": "hpu", "none": "cpu"}


@dataclasses.dataclass(frozen=True)
class SoftwareEnv:
    """How the nodes activate the training environment (absolute paths)."""

    modules: tuple[str, ...] = ()
    venv: str | None = None
    conda_root: str | None = None
    conda_env: str | None = None


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
    wait_all_nodes: bool
    account: str | None
    qos: str | None
    reservation: str | None
    dependency: str | None
    launcher: LauncherKind
    mpi: str | None  # srun --mpi=<this> for MPI binaries (nccl-tests)
    stops_on_signal: bool  # the workload saves and exits 75 on SIGUSR2 (else it resumes from its last checkpoint)
    requeue: bool  # False for benchmarks: no signal before the time limit, no requeue (recipe resources.requeue)
    signal_before_s: int  # SIGUSR2 this long before the time limit, then the job requeues itself
    software: SoftwareEnv
    env: tuple[EnvVar, ...]
    command: tuple[Arg, ...]
    prepare: tuple[str, ...]  # run once on the first node before the ranks: makes the data if missing
    run_dir: str
    derived: tuple[Derived, ...]
    warnings: tuple[str, ...] = ()  # toolkit.job.advice: the job will not do what its flags suggest
    srun_binding: tuple[str, ...] = ()  # srun CPU-binding options (Gaudi: cores per HPU rank)
    files: tuple[JobFile, ...] = ()
    style: LauncherStyle = "script"  # torchrun: one Slurm task per node starts that node's tasks_per_node ranks

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def slurm_tasks_per_node(self) -> int:
        """Slurm tasks per node: one per rank, or one torchrun per node."""
        return 1 if self.style == "torchrun" else self.tasks_per_node

    @property
    def slurm_cpus_per_task(self) -> int:
        """CPUs per Slurm task: a torchrun task holds the CPUs of all its node's ranks."""
        return self.cpus_per_task * (self.tasks_per_node if self.style == "torchrun" else 1)

    @property
    def program(self) -> RankProgram:
        """What srun starts on every Slurm task, on every submission path (toolkit.job.rank)."""
        return rank_program(self.command, self.world_size, self.tasks_per_node, contract=self.style == "script")

    @property
    def environ(self) -> dict[str, str]:
        return {var.name: var.value for var in self.env}

    @property
    def output(self) -> str:
        """The Slurm stdout/stderr file pattern (%j = job id)."""
        return f"{self.run_dir}/{self.job_name}-%j.out"

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


def _check_directive(what: str, value: str | None) -> None:
    if value is not None and not DIRECTIVE_SAFE.match(value):
        raise HpcError(f"{what} {value!r} cannot go into an #SBATCH line: only letters, digits and _.:,+=@%/?- "
                       "are allowed there", fix=f"choose a {what} without spaces, quotes or shell characters")


def _under(root: str, path: str) -> str:
    return path if path.startswith("/") else f"{root}/{path}"


def _device_forms(flags: Literal["fairseq", "trainer"] | None, args: dict, device: str, threads: int | None,
                  world: int) -> tuple[dict, list[Derived]]:
    """The recipe's args in the queue's device form (GPU as published; HPU: hccl; CPU: gloo, no half precision),
    for fairseq and our trainers; other programs' args are left as written."""
    args = dict(args)
    on_gpu = device == "gpu"
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
        if device == "hpu":
            raise HpcError("fairseq has no Habana HPU support", fix="run fairseq recipes on a GPU or CPU queue")
        if on_gpu:
            put("--distributed-backend", "nccl", "NCCL between GPUs")
        else:
            drop(FAIRSEQ_HALF_PRECISION, "no half precision on CPU")
            put("--cpu", True, "train on CPU")
            put("--distributed-backend", "gloo", "gloo is the CPU collective backend")
            put("--ddp-backend", "legacy_ddp", "pytorch_ddp/c10d pass GPU device_ids and fail on CPU")
        put("--distributed-world-size", world, "world size = nodes x ranks per node")
        put("--distributed-no-spawn", True, "srun starts one process per rank; fairseq must not spawn more")
    elif flags == "trainer":
        if on_gpu:
            put("--device", "cuda", "one GPU per rank (LOCAL_RANK)")
            put("--backend", "nccl", "NCCL between GPUs")
        elif device == "hpu":
            put("--device", "hpu", "one HPU per rank (the Habana bridge takes module id = LOCAL_RANK)")
            put("--backend", "hccl", "HCCL between HPUs (scale-out over EFA)")
        else:
            drop(("--amp",), "no mixed precision on CPU")
            put("--device", "cpu", "no GPUs")
            put("--backend", "gloo", "gloo is the CPU collective backend")
            put("--threads", threads, "torch threads = CPUs per task (oversubscription costs 2-3x)")
    return args, derived


def build_job_spec(recipe: Recipe, queue: Queue, nodes: int | None = None, *, profile: str | None = None,
                   account: str | None = None, qos: str | None = None, reservation: str | None = None,
                   dependency: str | None = None, run_dir: str | None = None) -> JobSpec:
    """The job for `recipe` on `nodes` nodes of `queue` (recipe's resources.nodes when None)."""
    instance = queue.instance
    device = DEVICE_OF_ACCELERATOR[instance.accelerator]
    on_gpu = device == "gpu"
    if device not in recipe.resources.runs_on:
        has = {"gpu": "GPUs", "hpu": "Gaudi HPUs", "cpu": "no GPUs"}[device]
        raise HpcError(f"recipe {recipe.name} runs on {' or '.join(recipe.resources.runs_on)} only; queue "
                       f"{queue.name} ({queue.instance_type}) has {has}",
                       fix="choose another queue with --cluster FILE --queue Q")
    nodes = nodes or recipe.resources.nodes
    if nodes > queue.max_nodes:
        raise HpcError(f"{nodes} nodes requested; queue {queue.name} has at most {queue.max_nodes}",
                       fix=f"use --nodes 1..{queue.max_nodes} or a bigger queue")
    ours = recipe.launcher.kind == "python-module" and (recipe.launcher.module or "").startswith(OUR_TRAINERS)
    controlled = FAIRSEQ_DISTRIBUTED if recipe.launcher.kind == "fairseq" else TRAINER_DEVICE if ours else ()
    for flag in controlled:
        if flag in recipe.args:
            raise HpcError(f"recipe {recipe.name}: args.{flag} is set by the toolkit from the queue",
                           fix=f"remove {flag} from the recipe (or --set args.{flag}=null)")

    tasks, cpus = queue.tasks_per_node, queue.cpus_per_task
    threads = None if device != "cpu" else cpus
    world = nodes * tasks
    root = recipe.dirs.root and os.path.abspath(recipe.dirs.root) or queue.fsx_mount or os.getcwd()
    root_rule = ("dirs.root of the recipe" if recipe.dirs.root else
                 f"queue {queue.name}'s FSx mount" if queue.fsx_mount else "no FSx mount on the queue: the current directory")
    job_name = recipe.name if profile is None else f"{recipe.name}-{profile}"
    run_dir = run_dir or f"{root}/runs/{job_name}"
    for what, value in (("run dir", run_dir), ("partition", queue.name), ("account", account), ("qos", qos),
                        ("reservation", reservation), ("dependency", dependency)):
        _check_directive(what, value)

    derived = [
        Derived("ranks per node", str(tasks), f"one per {device.upper()} ({queue.gpus_per_node} x {instance.gpu_model})"
                if device != "cpu" else f"queue {queue.name} declares {tasks} ranks per node (CPU queue)"),
        Derived("world size", str(world), f"{nodes} nodes x {tasks} ranks per node"),
        Derived("cpus per task", str(cpus), "queue override" if queue.cpus_per_task_override else
                f"{instance.vcpus} vCPUs / {tasks} ranks"),
        Derived("dirs root", root, root_rule),
        Derived("--wait-all-nodes", "1" if queue.has_dynamic_nodes else "not set",
                f"queue {queue.name} starts nodes on demand: run only once every node has booted"
                if queue.has_dynamic_nodes else f"queue {queue.name}'s nodes are all static (MinCount = MaxCount)"),
    ]
    args, scaled = apply_scaling(recipe.scaling, recipe.args, nodes=nodes, ranks_per_node=tasks,
                                 max_nodes=queue.max_nodes,
                                 gpu_memory_gib=instance.gpu_memory_gib if device != "cpu" else None)
    flags = "fairseq" if recipe.launcher.kind == "fairseq" else "trainer" if ours else None
    args, forms = _device_forms(flags, args, device, threads, world)
    derived += scaled + forms
    binding: tuple[str, ...] = ()
    if device == "hpu":
        from toolkit.job.gaudi import srun_binding

        binding, why = srun_binding(instance, tasks)
        derived += [Derived("srun cpu binding", " ".join(binding), why),
                    Derived("--gpus-per-node", "not set", "HPUs are no Slurm GPUs (ParallelCluster declares no GRES "
                                                          "for them): one rank per HPU via --ntasks-per-node")]

    positional: list[str] = []
    dir_paths: dict[str, str] = {}
    for name in ("data", "checkpoints", "logs"):
        entry = getattr(recipe.dirs, name)
        if entry is None:
            continue
        base, where = (run_dir, "the run dir") if entry.under == "run" else (root, "the dirs root")
        path = dir_paths[name] = _under(base, entry.dir)
        derived.append(Derived(f"{name} dir", path, f"dirs.{name}.dir under {where}" if path != entry.dir
                               else f"dirs.{name}.dir (absolute)"))
        if entry.arg == "positional":
            positional.append(path)
        elif entry.arg:
            args[entry.arg] = path

    files: tuple[JobFile, ...] = ()
    if recipe.deepspeed is not None:
        from toolkit.recipes.deepspeed import deepspeed_parts

        config_path = f"{run_dir}/deepspeed.json"
        text, ds_args, ds_derived = deepspeed_parts(recipe.deepspeed, config_path, nodes=nodes,
                                                    ranks_per_node=tasks, max_nodes=queue.max_nodes)
        args.update(ds_args)
        derived += ds_derived
        files = (JobFile(config_path, text, f"the DeepSpeed config generated from recipe {recipe.name} "
                                            f"(deepspeed: section) for {world} ranks"),)

    prepare: tuple[str, ...] = ()
    if recipe.prepare:
        if recipe.dirs.data is None:
            raise HpcError(f"recipe {recipe.name}: `prepare` makes the data, but dirs.data is not set",
                           fix="set dirs.data.dir (where the data goes), or remove `prepare`")
        prepare = (*recipe.prepare, _under(run_dir if recipe.dirs.data.under == "run" else root,
                                           recipe.dirs.data.dir))

    launcher = recipe.launcher
    if launcher.kind in ("python-module", "python-script") and not (ours and launcher.style == "script"):
        program, how = _python_program(launcher, root, nodes, tasks)
        derived.append(how)
    else:  # our trainers under srun read the rank contract (toolkit.workloads.rank_env)
        # deepspeed: one process per rank under srun; DeepSpeed reads the rank contract (toolkit.job.rank)
        program = {"fairseq": ["fairseq-train"], "python-module": ["python", "-m", launcher.module or ""],
                   "binary": [_under(root, launcher.program or "")],
                   "deepspeed": ["python", _under(root, launcher.script or "")],
                   }[launcher.kind]
    command: list[Arg] = [*program, *positional]
    for flag, value in args.items():
        command += flag_words(flag, value)
    if launcher.kind == "fairseq":  # explicit rendezvous: fairseq's own Slurm auto-detection is unsafe
        command += ["--distributed-rank", RankVar.RANK, "--device-id", RankVar.LOCAL_RANK,
                    "--distributed-init-method", ("tcp://", RankVar.MASTER_ADDR, ":", RankVar.MASTER_PORT)]

    words = [w for w in command if isinstance(w, str)]
    advice, warnings = (fairseq_run_length(words, dir_paths.get("data"), world) if launcher.kind == "fairseq"
                        else ([], []))
    lr_rule = recipe.scaling.get("--lr")
    if lr_rule is not None and lr_rule.rule == "linear" and isinstance(args.get(lr_rule.per_rank_arg), (int, float)):
        warnings += large_batch(args[lr_rule.per_rank_arg] * world)
    derived += advice

    software = recipe.software
    venv = software.venv and _under(root, software.venv)
    if (recipe.launcher.kind != "binary" and not (software.venv or software.conda_root or software.modules)
            and sys.prefix != sys.base_prefix):
        venv = sys.prefix  # same Python on every node, as submitit's per-rank code needs
        derived.append(Derived("software", venv, "the recipe names no software: the nodes use the venv "
                                                 "this toolkit runs in (it must be on a shared filesystem)"))
    return JobSpec(
        job_name=job_name, recipe=recipe.name, profile=profile, partition=queue.name,
        instance_type=queue.instance_type, nodes=nodes, tasks_per_node=tasks,
        gpus_per_node=queue.gpus_per_node if on_gpu else 0, cpus_per_task=cpus, threads_per_rank=threads,
        time_limit=recipe.resources.time, exclusive=recipe.resources.exclusive, wait_all_nodes=queue.has_dynamic_nodes,
        account=account, qos=qos, reservation=reservation, dependency=dependency,
        launcher=launcher.kind, mpi=launcher.mpi, stops_on_signal=launcher.stops_on_signal,
        requeue=recipe.resources.requeue, signal_before_s=recipe.resources.signal_before_s,
        software=SoftwareEnv(
            modules=tuple(software.modules),
            venv=venv,
            conda_root=software.conda_root and _under(root, software.conda_root),
            conda_env=software.conda_env,
        ),
        env=job_env(instance, queue.fabric, threads_per_rank=threads, launcher_kind=launcher.kind,
                    recipe_env=recipe.env, recipe_name=recipe.name),
        command=tuple(command), prepare=prepare, run_dir=run_dir, derived=tuple(derived), warnings=tuple(warnings),
        srun_binding=binding, files=files, style=launcher.style,
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
