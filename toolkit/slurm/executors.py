"""JobSpec -> a submission: through submitit (on Slurm, or on this machine where no Slurm is installed), or the
rendered script itself with sbatch.

The executor kinds, one vocabulary for `--executor`, the plan, the run dir's metadata and `hpc jobs`:

    sbatch   the rendered script (toolkit.slurm.render), sent with `sbatch --parsable`: its srun line starts the
             job's rank program (toolkit.job.rank). The default on Slurm for a single job: it needs nothing of
             hpc's on the nodes (toolkit.node's contract), and each rank is its program alone, where submitit's
             adds a Python that imports submitit first (1.0-1.3 CPU-s for 4 ranks, half of what hpc's start cost
             on the 2-core bench: docs/start-up.md). MPI binaries (nccl-tests) always go this way.
    slurm    submitit's SlurmExecutor: the job's resources become its parameters, its set-up block (software,
             exports, rendezvous) its setup lines, and srun starts one RankTask per Slurm task, which runs the
             same rank program. The default for a sweep (one submitit job array), and on request (--executor slurm)
    local    submitit's LocalExecutor: this machine is the one node (chosen where no Slurm is installed and no
             cluster config is given)
"""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
from pathlib import Path
from typing import Any, Sequence

from toolkit.errors import HpcError
from toolkit.job.env import filter_submit_env
from toolkit.slurm.render import job_options, node_python, setup_block, slurm_part, srun_options
from toolkit.job.spec import JobSpec
from toolkit.rundir import Executor
# also still imported from here by toolkit.health.preflight, until it imports toolkit.slurm.env (health must not
# import submit: tests/test_architecture.py)
from toolkit.slurm.env import clean_sbatch_env

# submitit stops requeueing a job after this many time-limit stops (its max_num_timeout, default 3). A run of
# ours resumes from its checkpoint however often it meets its time limit, as the rendered script's trap does.
MAX_TIME_LIMIT_REQUEUES = 1000


def submitit_unfit(python: str) -> str | None:
    """Why the nodes' Python cannot run submitit's side of a job, where this machine can tell, else None.

    submitit's node side unpickles the job (a cloudpickle of our rank task, made by this Python) with
    `python -m submitit.core._submit`: the nodes' Python needs submitit and this Python's major.minor. A venv on the
    shared file system says both in its pyvenv.cfg and site-packages (and whether it holds hpc, whose rank task
    submitit unpickles there); a `python` that modules, conda or a container
    put on PATH, or a venv not readable from here, cannot be told (None: submitit is tried, as before)."""
    import sys

    if not os.path.isabs(python) or os.path.realpath(python) == os.path.realpath(sys.executable):
        return None
    from toolkit.job.staging import venv_python

    prefix = Path(python).parent.parent
    version, here = venv_python(str(prefix)), sys.version_info[:2]
    if version is None:  # not readable from here (a plan made off the cluster), or not a venv: not known
        return None
    if version != here:
        return (f"the job's venv {prefix} is Python {version[0]}.{version[1]}, and submitit's node side needs this "
                f"Python's {here[0]}.{here[1]}")
    if not list(prefix.glob("lib/python*/site-packages/submitit")):
        return f"the job's venv {prefix} has no submitit"
    # the pickled job is hpc's rank task (toolkit.slurm.rank_task), imported by reference on the node: the venv
    # needs hpc itself too (an install or an editable one, each leaves its dist-info)
    if not list(prefix.glob("lib/python*/site-packages/hpc_toolkit-*.dist-info")):
        return f"the job's venv {prefix} has no hpc (submitit's node side runs hpc's rank task)"
    return None


def choose_executor(requested: str | None, *, mpi: bool = False, spares: int = 0,
                    node_python: str | None = None, cluster_given: bool = False,
                    array: bool = False) -> tuple[Executor, str | None]:
    """The executor, and a note when it was chosen for the user (local only where no Slurm is installed and no
    cluster config names the target). `node_python`: the Python the job's nodes run (render.node_python); where
    submitit cannot run there the rendered script goes to sbatch instead, which needs nothing of hpc's on the
    nodes (toolkit.node's contract). `cluster_given`: the queue comes from a cluster config (--cluster or
    $HPC_CLUSTER_CONFIG), so the job is that cluster's Slurm's even where this machine has none: it is planned
    as it would be there, and only submitting needs Slurm here (planned_without_slurm, toolkit.slurm.targets).
    `array`: the job is a sweep's job array, which is submitit's (toolkit.submit.sweep). A single job goes to sbatch
    as its rendered script unless asked otherwise; that is also the one whose srun orders the ranks by a queue's
    topology file (toolkit.slurm.hostfile: submitit writes its own srun line)."""
    from toolkit.slurm.commands import slurm_installed

    on_slurm = cluster_given or slurm_installed()  # the job goes to a Slurm: the given cluster's, or this one's
    names = [kind.value for kind in Executor]
    if requested is not None and requested not in names:
        raise HpcError(f"--executor {requested!r} is not one of {', '.join(names)}",
                       fix=f"use --executor {' | '.join(names)}", exit_code=2)
    kind = Executor(requested) if requested else None
    if spares:
        if kind not in (None, Executor.SBATCH) or not on_slurm:
            missing = "" if on_slurm else "; no Slurm is installed here"
            raise HpcError(f"--spares {spares}: spare nodes are a Slurm allocation's, restarted on by the rendered "
                           f"script (toolkit.node.spares){missing}",
                           fix="submit to a Slurm cluster without --executor (or with --executor sbatch), or drop "
                               "--spares", exit_code=2 if kind not in (None, Executor.SBATCH) else 1)
        return Executor.SBATCH, None
    if mpi:
        if kind == Executor.LOCAL or (kind is None and not on_slurm):
            raise HpcError("this recipe runs an MPI binary, which only Slurm can start (srun --mpi)",
                           fix="submit it to a Slurm cluster")
        return Executor.SBATCH, (None if kind in (None, Executor.SBATCH) else
                                 "an MPI binary: its rendered script goes to sbatch (srun --mpi ranks it)")
    if kind is None and not on_slurm:
        return Executor.LOCAL, ("no Slurm is installed here (no sbatch on PATH or in /opt/slurm/bin): running on "
                                "this machine")
    if kind is None and not array:
        return Executor.SBATCH, None
    # submitit's side runs on the nodes from here on: asked for, or a sweep's array
    unfit = submitit_unfit(node_python) if node_python and kind in (None, Executor.SLURM) else None
    if kind == Executor.SLURM and unfit:
        raise HpcError(f"--executor slurm (submitit): {unfit}",
                       fix="drop --executor (or use --executor sbatch): the rendered script needs only the nodes' "
                           "own python3; or install submitit in that venv with this Python's version",
                       exit_code=2)
    if kind is not None:
        return kind, None
    if unfit:  # a sweep whose nodes cannot run submitit's side: the sweep refuses the rendered script, naming why
        return Executor.SBATCH, f"{unfit}: the rendered script goes to sbatch (it needs nothing of hpc's there)"
    return Executor.SLURM, None


def planned_without_slurm(kind: Executor) -> str | None:
    """The one note of a plan for Slurm made where no Slurm is installed (a laptop with the cluster's config):
    what it could not ask a live Slurm. None where Slurm is here, or the job is not Slurm's."""
    from toolkit.slurm.commands import slurm_installed

    if kind == Executor.LOCAL or slurm_installed():
        return None
    return ("no Slurm is installed here (no sbatch on PATH or in /opt/slurm/bin): planned for Slurm without asking "
            "one (its controller and `sbatch --test-only` answer at submit; MaxArraySize and --requeue=expedite come "
            "from the cluster config, else Slurm's defaults); submitting needs Slurm: submit from the cluster's "
            "head or login node")


def slurm_parameters(spec: JobSpec) -> dict[str, Any]:
    """submitit SlurmExecutor parameters for a JobSpec: toolkit.slurm.render.job_options(), the same options as
    the rendered script's #SBATCH lines.

    All options go in `additional_parameters`, which submitit writes as they are and which replace its own
    defaults of the same name (job_name "submitit", time 5); nodes, tasks per node and the time in minutes are
    also named, since submitit counts a job's tasks and times its own requeue logic from them. --export=ALL of the
    clean environment sbatch gets (see toolkit.slurm.env.clean_sbatch_env): exactly the allow-listed variables,
    like the rendered script's --export=LIST, but without the login-environment load that a variable list implies
    on the node (about 1.3 s per job here). The stop signal goes to the steps (toolkit.node.stop: step_signal), where
    submitit's per-rank handler calls RankTask.checkpoint().
    """
    options = {name.replace("-", "_"): value for name, value in job_options(spec).items()}
    # split("\n"), not splitlines(): that also splits at \r, \x85, \u2028 inside a quoted value, and submitit
    # joins the lines with "\n" again, changing the value.
    setup = setup_block(spec).rstrip("\n").split("\n")
    return dict(nodes=spec.nodes, ntasks_per_node=slurm_part(spec).tasks_per_node, time=spec.time_limit_minutes,
                signal_delay_s=spec.stop.before_s, setup=setup, srun_args=srun_options(spec),
                additional_parameters={**options, "export": "ALL", "signal": spec.stop.step_signal})


def local_parameters(spec: JobSpec) -> dict[str, Any]:
    """submitit LocalExecutor parameters: this machine is the one node."""
    return {"nodes": 1, "tasks_per_node": slurm_part(spec).tasks_per_node, "timeout_min": spec.time_limit_minutes}


def slurm_executor(folder: Path, parameters: dict[str, Any], python: str, *, text_only: bool = False):
    """A submitit Slurm executor with a plan's parameters (submit through it inside sbatch_environment()).
    `text_only`: one that only writes its batch script's text, made where no srun is installed too."""
    import submitit

    executor = _script_text_executor() if text_only else submitit.SlurmExecutor
    ex = executor(folder=folder, python=shlex.quote(python), max_num_timeout=MAX_TIME_LIMIT_REQUEUES)
    ex.update_parameters(**parameters)
    return ex


def submitit_batch_script(spec: JobSpec, folder: Path, array_tasks: int | None = None,
                          array_parallelism: int | None = None) -> str:
    """The batch script submitit will hand to sbatch for this job (an array of `array_tasks` tasks), made by
    submitit's own code from the same parameters: what `--dry-run` shows is what runs."""
    parameters = slurm_parameters(spec)
    if array_parallelism:
        parameters["array_parallelism"] = array_parallelism
    ex = slurm_executor(folder, parameters, node_python(spec), text_only=True)
    if array_tasks is not None:
        ex.parameters["map_count"] = array_tasks  # as submitit's batch submission sets it for an array
    return ex._make_submission_file_text(ex._submitit_command_str, uid="")  # noqa: SLF001 (pinned submitit)


@functools.cache
def _script_text_executor() -> type:
    """submitit's SlurmExecutor, for the text of its batch script only: its __init__ refuses where `srun` is not
    on PATH (affinity() < 0: submitit/slurm/slurm.py, SlurmExecutor.__init__ and affinity, pinned 1.5.4), which a
    plan for a cluster made off it is. The text is made by submitit's own _make_sbatch_string all the same; what
    submits is always submitit's own class (slurm_executor)."""
    import submitit

    class ScriptTextSlurmExecutor(submitit.SlurmExecutor):
        @classmethod
        def affinity(cls) -> int:
            return 2  # submitit's own value where srun is found

    return ScriptTextSlurmExecutor


@contextlib.contextmanager
def sbatch_environment():
    """While submitit runs sbatch, this process's environment is clean_sbatch_env(): with --export=ALL, the job
    then gets exactly the allow-list. (submitit starts sbatch with the inherited environment, and makes its own
    executors for job arrays, so the environment is the one place to set this for every path.)"""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(clean_sbatch_env(saved))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def submit_submitit(spec: JobSpec, run_dir: Path, parameters: dict[str, Any], python: str | None,
                    local: bool) -> str:
    """Submit one job through submitit with a plan's parameters; returns its id (the run dir must exist)."""
    import submitit

    from toolkit import __version__
    from toolkit.slurm.rank_task import RankTask

    folder = run_dir / "submitit"
    if local:  # one node: the local target's dry run, which made the plan, refused more
        ex = submitit.LocalExecutor(folder=folder)
        ex.update_parameters(**parameters)
        env = {**filter_submit_env(os.environ), **spec.environ}
        task = RankTask.for_spec(spec, run_dir, __version__, local_env=tuple(env.items()))
    else:
        ex = slurm_executor(folder, parameters, python or node_python(spec))
        task = RankTask.for_spec(spec, run_dir, __version__)
    try:
        with sbatch_environment():
            job = ex.submit(task)
    except submitit.core.utils.FailedJobError as exc:  # sbatch refused the job
        raise refused(str(exc).strip().splitlines()) from None
    return str(job.job_id)


def preflight(script: str) -> None:
    """Ask sbatch whether a job script could ever run (`--test-only`), before anything is written or submitted.

    Without EnforcePartLimits, sbatch accepts a job asking for more nodes than its partition has; it would
    then pend forever (reason PartitionConfig).
    """
    from toolkit.slurm import commands

    res = commands.run(["sbatch", "--test-only"], input=script, check=False)
    if res.returncode != 0:
        raise refused(res.stderr.splitlines())


def refused(sbatch_output: list[str]) -> HpcError:
    """The error for a job sbatch refused, naming sbatch's own reason."""
    errors = [line for line in sbatch_output if "error" in line.lower()]
    reason = (errors or sbatch_output or ["sbatch failed"])[-1].strip()
    return HpcError(f"Slurm refused the job: {reason}",
                    fix="check --queue/--nodes against `sinfo` (the partition's nodes and limits)")


def submit_script(argv: Sequence[str]) -> str:
    """The rendered script itself, sent with `sbatch --parsable --export=ALL` (a plan's argv) from the clean
    environment (clean_sbatch_env): the job gets exactly the allow-listed variables, as submitit's jobs do, and
    no login environment. Its --output is in the run dir, which exists by now (Slurm would not create it)."""
    from toolkit.slurm import commands

    res = commands.run(list(argv), check=False, env=clean_sbatch_env(dict(os.environ)))
    if res.returncode != 0:
        raise refused(res.stderr.splitlines())
    return res.stdout.strip().split(";")[0]
