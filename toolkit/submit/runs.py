"""What `hpc jobs` shows: runs in the runs root joined with Slurm's view of their jobs (single jobs and
sweeps' job arrays alike).

Slurm forgets finished jobs (MinJobAge, no accounting): then the run dir's result.json says how it ended.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path
from typing import Any, Iterator

from toolkit import rundir
from toolkit.errors import HpcError, UsageError
from toolkit.rundir import SWEEP, Array, Executor, Metadata, RunDir
from toolkit.slurm import status as slurm_status
from toolkit.slurm.status import State
from toolkit.submit.runsroot import reader_roots


@dataclasses.dataclass
class RunStatus:
    job_id: str
    state: State
    source: str  # sacct | squeue | scontrol | run-dir | local
    run_dir: str | None
    recipe: str | None = None
    nodes: int | None = None
    requeues: int = 0
    exit_code: str | None = None
    reason: str | None = None
    tasks: dict[str, int] | None = None  # array jobs: state -> count

    @property
    def done(self) -> bool:
        return self.state.done


# A running job's rank is called stalled after this long without a step (hpc jobs status --stall-after).
STALL_AFTER_S = 120.0


# The ids Slurm's own commands take (squeue -j, scancel): 1234, an array task 1234_5, a heterogeneous job's
# component 1234+1. A run dir also answers to its name (a sweep's dir) and a Kubernetes run to its own id.
SLURM_JOB_ID = re.compile(r"^\d+(_\d+)?(\+\d+)?$")


def find_run(job_id: str, root: Path | None) -> RunDir | None:
    """The run dir that records `job_id` (None: Slurm may still know the job); a usage error for an id that no run
    dir records and that Slurm could not know either (a typo, a name)."""
    roots = [root] if root else reader_roots()
    run = rundir.find_run(job_id, roots)
    if run is None and not SLURM_JOB_ID.match(job_id):
        raise UsageError(f"{job_id!r} is not a job id: Slurm's are numbers (1234; an array task 1234_5), and no "
                         f"run in {', '.join(str(r) for r in roots)} answers to it",
                         fix="copy the id from `hpc jobs list` (or from what `hpc recipes submit` printed)")
    return run


def progress(run: RunDir, job_id: str | None, running: bool, stall_after_s: float | None = None,
             stacks: bool = False) -> dict[str, Any] | None:
    """The ranks' heartbeats read back (toolkit.node.heartbeat): how far they got and, while the job runs,
    which ranks stopped progressing and which of them the others wait for; with `stacks`, each rank's Python
    stacks are collected first (they tell a rank stuck in its own code from ranks waiting in a collective).
    Also what the hang watchdog recorded if it ended the job. None where the run has neither. `job_id`: Slurm's,
    None for a local run (its ranks are asked for stacks by pid)."""
    from toolkit.node import heartbeat

    beats, hang = run.heartbeats(), run.hang()
    if not beats and not hang:
        return None
    interval = max((b.interval for b in beats), default=heartbeat.DEFAULT_INTERVAL_S)
    after = stall_after_s if stall_after_s is not None else max(STALL_AFTER_S, 3 * interval)
    found: dict[int, str] | None = None
    if stacks and running and beats:
        heartbeat.collect_stacks(run.heartbeat_dir, beats, min(max(3.0, 2 * interval), 30.0), job_id)
        found = heartbeat.read_stacks(run.heartbeat_dir)
    now = time.time()
    diagnosis = heartbeat.diagnose(beats, now, after, found) if running and beats else None
    steps = [b.step for b in beats if b.step is not None]
    return {"ranks": len(beats), "steps": [min(steps), max(steps)] if steps else None,
            "newest_beat_s": round(now - max(b.time for b in beats), 1) if beats else None,
            "stall_after_s": after, "diagnosis": diagnosis.to_json() if diagnosis else None,
            "lines": diagnosis.lines() if diagnosis else [],
            "stacks": {str(rank): str(run.heartbeat_dir / f"rank-{rank}.stack") for rank in sorted(found or {})},
            # asked and silent: faulthandler answers from its C signal handler even while C code holds the GIL,
            # so such a rank is stopped (SIGSTOP), in uninterruptible I/O (D state), or its node is unreachable
            "no_stack": sorted({b.rank for b in beats} - set(found)) if found is not None else [],
            "hang": hang}


def state_from_run_dir(run: RunDir) -> State:
    """How a run ended by its own records (RunDir.outcome): rank 0's result, else a failed rank's, else UNKNOWN."""
    return {True: State.COMPLETED, False: State.FAILED, None: State.UNKNOWN}[run.outcome()]


def status(job_id: str, root: Path | None = None) -> RunStatus:
    run = find_run(job_id, root)
    meta = (run.metadata() if run else None) or Metadata()
    if run is not None and meta.kind == SWEEP:
        return sweep_status(job_id, run, meta)
    from toolkit.target import target_for

    # a run dir without metadata, or no run dir here at all: Slurm may still know the job
    found = target_for(meta.executor or Executor.SLURM).status([job_id], run)
    base = RunStatus(job_id, State.UNKNOWN, "run-dir", str(run.path) if run else None, meta.recipe, meta.nodes)
    if job_id in found:
        s = found[job_id]
        return dataclasses.replace(base, state=s.state, source=s.source, requeues=s.requeues,
                                   exit_code=s.exit_code, reason=s.reason)
    tasks = [s for key, s in found.items() if key.startswith(f"{job_id}_")]
    if tasks:  # a job array submitted by other means: summarise its tasks
        return dataclasses.replace(base, state=array_state(tasks), source=tasks[0].source,
                                   tasks=state_counts(tasks), requeues=sum(t.requeues for t in tasks))
    if run is None:
        from toolkit.slurm.commands import check_controller

        check_controller(f"cannot tell whether job {job_id} exists")
        where = ", ".join(str(r) for r in ([root] if root else reader_roots()))
        raise HpcError(f"job {job_id} is unknown to Slurm and to the runs in {where}",
                       fix="check the id (`hpc jobs list`), or set HPC_RUNS_DIR to where the run was submitted from")
    return dataclasses.replace(base, state=state_from_run_dir(run))


def list_statuses(root: Path | None = None) -> list[RunStatus]:
    """Every run in the runs root, newest last, with one Slurm query for all of them."""
    runs = [(run, run.metadata() or Metadata()) for run in rundir.list_runs(root or reader_roots())]
    from toolkit.target import target_for

    slurm_ids = [j for run, meta in runs if target_for(meta.executor or Executor.SLURM).scheduler == "slurm"
                 for j in meta.job_ids]
    answer = slurm_status.ask(slurm_ids) if slurm_ids else slurm_status.Answer({}, False)
    found = answer.jobs
    out = []
    for run, meta in runs:
        if meta.kind == SWEEP and meta.sweep_arrays:
            out.append(sweep_summary(run, meta, answer))
            continue
        for job_id in meta.job_ids or ["-"]:
            s = found.get(job_id)
            out.append(RunStatus(job_id, s.state if s else state_from_run_dir(run), s.source if s else "run-dir",
                                 str(run.path), meta.recipe, meta.nodes, s.requeues if s else 0))
    return out




def failure_reason(log: str, task: int | None = None) -> str | None:
    """The launcher's own one-line error in a rank's log (`hpc: error: ...`, toolkit.job.user_main), if any; in
    the rendered script's one log, `task`'s lines (srun --label)."""
    try:
        lines = Path(log).read_text(errors="replace").splitlines()
    except OSError:
        return None
    if task is not None:
        lines = list(rundir.task_lines(lines, task))
    said = next((line.removeprefix("hpc: error: ") for line in lines if line.startswith("hpc: error: ")), None)
    return said or python_error(lines)


# The line a Python traceback ends with: the exception and its message (`KeyError: 'b'`, `torch.OutOfMemoryError:
# CUDA out of memory ...`), after the frames' indented lines.
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit)\b(?::.*)?$")


def python_error(lines: list[str]) -> str | None:
    """The exception line of the last Python traceback in a rank's lines, if any (a fault probe: rank 1's
    KeyError was in its log, and --wait named the rank and the log but not the error)."""
    start = max((i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")),
                default=None)
    if start is None:
        return None
    return next((line.strip() for line in lines[start + 1:] if EXCEPTION_LINE.match(line.strip())), None)


# -- sweeps: job arrays, a run dir per task (toolkit.submit.sweep) -----------------------------------------------

def state_counts(tasks) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in tasks:
        counts[t.state] = counts.get(t.state, 0) + 1
    return counts


def array_state(tasks) -> State:
    """An array as one state: RUNNING/PENDING while any task is, else COMPLETED when every task completed, else
    FAILED (UNKNOWN while nobody knows any task yet)."""
    active = [t for t in tasks if not t.done and t.state != State.UNKNOWN]
    if active:
        return State.PENDING if all(t.state == State.PENDING for t in active) else State.RUNNING
    states = {t.state for t in tasks}
    if states == {State.UNKNOWN}:
        return State.UNKNOWN
    return State.COMPLETED if states == {State.COMPLETED} else State.FAILED


def ask_sweep(meta: Metadata) -> slurm_status.Answer:
    """All the sweep's arrays in one Slurm call (sacct -j A,B,C; without accounting squeue -r -j A,B,C)."""
    return slurm_status.ask([a.job_id for a in meta.sweep_arrays], restarts=False)


def sweep_task_statuses(run: RunDir, meta: Metadata, answer: slurm_status.Answer) -> list[RunStatus]:
    """Each task's RunStatus: Slurm's view (`answer`), else its run dir's."""
    ids = meta.task_ids
    out = []
    for index, job_id in enumerate(ids):
        task = run.task(index, len(ids))
        s = answer.jobs.get(job_id)
        if s is None:
            state = state_from_run_dir(task)
            if answer.accounting:  # accounting forgets nothing: a task it lacks is one it has not recorded yet
                # (slurmdbd lags the controller). Not ended by Slurm's word, whatever its run dir says: rank 0's
                # result is written before the job ends (a sweep's --wait saw all done while a task still ran).
                state = State.PENDING if state == State.UNKNOWN else State.RUNNING
            out.append(RunStatus(job_id, state, "run-dir", str(task.path), meta.recipe, meta.nodes))
        else:
            out.append(RunStatus(job_id, s.state, s.source, str(task.path), meta.recipe, meta.nodes,
                                 s.requeues, s.exit_code, s.reason))
    return out


def sweep_summary(run: RunDir, meta: Metadata, answer: slurm_status.Answer) -> RunStatus:
    """The whole sweep (all its arrays) as one RunStatus, named by its first array, with a count per state."""
    tasks = sweep_task_statuses(run, meta, answer)
    source = next((t.source for t in tasks if t.source != "run-dir"), "run-dir")
    return RunStatus(meta.sweep_arrays[0].job_id, array_state(tasks), source, str(run.path), meta.recipe,
                     meta.nodes, sum(t.requeues for t in tasks), tasks=state_counts(tasks))


def sweep_status(job_id: str, run: RunDir, meta: Metadata) -> RunStatus:
    """`hpc jobs status` of a sweep: the whole sweep (any of its arrays' ids, or its dir's name), or one task
    (ID_N); one Slurm call either way."""
    answer = ask_sweep(meta)
    if (job_id == run.name or job_id in {a.job_id for a in meta.sweep_arrays}) and len(meta.task_ids) > 1:
        return sweep_summary(run, meta, answer)
    for task in sweep_task_statuses(run, meta, answer):
        if task.job_id == job_id:
            return task
    raise HpcError(f"sweep {run.name} has no task {job_id}",
                   fix=f"its tasks are {', '.join(_task_range(a) for a in meta.sweep_arrays)}")


def _task_range(array: Array) -> str:
    return " .. ".join(dict.fromkeys(array.task_job_id(n) for n in (0, array.count - 1)))


def sweep_arrays(meta: Metadata) -> list[dict[str, Any]]:
    """A sweep's arrays as JSON: {"job_id", "first" (its first task's index in the sweep), "count"}."""
    return [dataclasses.asdict(a) for a in meta.sweep_arrays]


def sweep_failed_tasks(sweep_dir: Path, meta: Metadata) -> list[dict]:
    """The tasks that did not complete, each with the log of its first failing rank (if any)."""
    return [{"job_id": t.job_id, "state": t.state, "run_dir": t.run_dir,
             "log": str(log) if t.run_dir and (log := RunDir(Path(t.run_dir)).failed_rank_log(t.job_id)) else None}
            for t in sweep_task_statuses(RunDir(sweep_dir), meta, ask_sweep(meta)) if t.state != State.COMPLETED]


def cancel_ids(job_id: str, root: Path | None = None) -> list[str]:
    """What `hpc jobs cancel` ends: a sweep's every array for the sweep's id (any array's, or its dir's name),
    else the id itself (one task ID_N stays one task)."""
    return _cancel_ids(job_id, rundir.find_run(job_id, root or reader_roots()))[0]


def _cancel_ids(job_id: str, run: RunDir | None) -> tuple[list[str], Metadata]:
    meta = (run.metadata() if run else None) or Metadata()
    arrays = [a.job_id for a in meta.sweep_arrays] if meta.kind == SWEEP else []
    if (run is not None and job_id == run.name) or job_id in arrays:
        return arrays, meta
    return [job_id], meta


def cancel(job_id: str, root: Path | None = None) -> list[str]:
    """End a job (or a sweep's arrays) through the target that ran it: scancel on Slurm, the process on this
    machine for the local executor. Returns the ids ended."""
    from toolkit.target import target_for

    ids, meta = _cancel_ids(job_id, find_run(job_id, root))  # a typo: scancel would say only "Invalid job id"
    target_for(meta.executor or Executor.SLURM).cancel(ids)
    return ids


def rank_lines(job_id: str, rank: int, stream: str = "out", keep_following: bool = False,
               root: Path | None = None) -> Iterator[str]:
    """One rank's log lines, whatever executor ran the job (RunDir.rank_log); from the job's one log (the sbatch
    executor's), only that rank's lines without srun's label (rundir.task_lines). keep_following: until the job
    ends (follow())."""
    run = _run_of(job_id, root)
    ranks = (run.metadata() or Metadata()).ranks
    if ranks and not 0 <= rank < ranks:  # the job's one log (sbatch) would give only the lines no rank wrote
        raise HpcError(f"job {job_id} has {ranks} rank(s), 0 to {ranks - 1}: there is no rank {rank}",
                       fix=f"pick a rank from 0 to {ranks - 1} with --rank")
    path = _rank_log(run, job_id, rank, stream)
    if keep_following:
        lines = follow(path, lambda: status(job_id).done)
    else:
        lines = iter(path.read_text(errors="replace").splitlines(keepends=True))
    return rundir.task_lines(lines, rank) if run.shares_log(job_id, path) else lines


def _run_of(job_id: str, root: Path | None) -> RunDir:
    run = find_run(job_id, root)
    if run is None:
        raise HpcError(f"no run dir records job {job_id}", fix="check the id with `hpc jobs list`")
    return run


def _rank_log(run: RunDir, job_id: str, rank: int, stream: str) -> Path:
    """Where one rank's log is (RunDir.rank_log), or an error that names the logs there are."""
    path = run.rank_log(job_id, rank, stream)
    if path is None:
        have = run.log_names(job_id, stream)
        raise HpcError(f"no log for rank {rank} of job {job_id} in {run.path}",
                       fix=f"logs there: {', '.join(have) or 'none yet (the job may not have started)'}")
    return path


def follow(path: Path, is_done, poll_s: float = 1.0) -> Iterator[str]:
    """Yield a log's lines as they are written, until is_done() and nothing new arrives. Only whole lines while
    the job runs: the tail of a line caught half-written would lose its srun label (rundir.task_lines)."""
    with path.open(errors="replace") as fh:
        partial = ""
        while True:
            partial += fh.readline()
            if partial.endswith("\n"):
                yield partial
                partial = ""
                continue
            if is_done():
                yield from (partial + fh.read()).splitlines(keepends=True)
                return
            time.sleep(poll_s)
