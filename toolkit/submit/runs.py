"""What `hpc jobs` shows: runs in the runs root joined with Slurm's view of their jobs.

Slurm forgets finished jobs (MinJobAge, no accounting): then the run dir's result.json says how it ended.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Iterator

from toolkit.errors import HpcError
from toolkit.slurm import status as slurm_status
from toolkit.submit import rundir


@dataclasses.dataclass
class RunStatus:
    job_id: str
    state: str
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
        return self.state in slurm_status.FINAL_STATES


def state_from_run_dir(run: Path) -> str:
    """How a run ended by its own records: rank 0's result, else a failed rank's record, else UNKNOWN."""
    result = rundir.read_json(run / rundir.RESULT)
    if result:
        return "COMPLETED" if result.get("ok") else "FAILED"
    if any((run / "failures").glob("rank-*.json")):
        return "FAILED"
    return "UNKNOWN"


def _local_state(job_id: str, run: Path) -> str:
    """A local run: its result, else whether submitit's process (job id = its pid) still runs."""
    import os

    state = state_from_run_dir(run)
    if state != "UNKNOWN":
        return state
    try:
        os.kill(int(job_id), 0)
        return "RUNNING"
    except (ProcessLookupError, ValueError):
        return "FAILED"  # gone without rank 0's result
    except PermissionError:
        return "RUNNING"


def status(job_id: str, root: Path | None = None) -> RunStatus:
    run = rundir.find_run(job_id, root)
    meta = (rundir.read_json(run / rundir.METADATA) if run else None) or {}
    if meta.get("kind") == "sweep":
        from toolkit.submit import sweep

        return sweep.status(job_id, run, meta)
    if meta.get("executor") == "local":
        return RunStatus(job_id, _local_state(job_id, run), "local", str(run), meta.get("recipe"), meta.get("nodes"))
    found = slurm_status.query([job_id])
    base = RunStatus(job_id, "UNKNOWN", "run-dir", str(run) if run else None, meta.get("recipe"), meta.get("nodes"))
    if job_id in found:
        s = found[job_id]
        return dataclasses.replace(base, state=s.state, source=s.source, requeues=s.requeues,
                                   exit_code=s.exit_code, reason=s.reason)
    tasks = [s for key, s in found.items() if key.startswith(f"{job_id}_")]
    if tasks:  # a job array: summarise its tasks
        counts: dict[str, int] = {}
        for t in tasks:
            counts[t.state] = counts.get(t.state, 0) + 1
        state = "RUNNING" if any(not t.done for t in tasks) else (
            "COMPLETED" if set(counts) == {"COMPLETED"} else "FAILED")
        return dataclasses.replace(base, state=state, source=tasks[0].source, tasks=counts,
                                   requeues=sum(t.requeues for t in tasks))
    if run is None:
        from toolkit.slurm.commands import check_controller

        check_controller(f"cannot tell whether job {job_id} exists")
        raise HpcError(f"job {job_id} is unknown to Slurm and to the runs in {rundir.runs_root()}",
                       fix="check the id (`hpc jobs list`), or set HPC_RUNS_DIR to where the run was submitted from")
    return dataclasses.replace(base, state=state_from_run_dir(run))


def list_statuses(root: Path | None = None) -> list[RunStatus]:
    """Every run in the runs root, newest last, with one Slurm query for all of them."""
    runs = [(run, rundir.read_json(run / rundir.METADATA) or {}) for run in rundir.list_runs(root)]
    slurm_ids = [str(j) for run, meta in runs if meta.get("executor") != "local" for j in meta.get("job_ids", [])]
    found = slurm_status.query(slurm_ids) if slurm_ids else {}
    out = []
    for run, meta in runs:
        if meta.get("kind") == "sweep" and meta.get("array_job_id"):
            from toolkit.submit import sweep

            out.append(sweep.summary(run, meta, found))
            continue
        for job_id in [str(j) for j in meta.get("job_ids", [])] or ["-"]:
            s = found.get(job_id)
            out.append(RunStatus(job_id, s.state if s else state_from_run_dir(run), s.source if s else "run-dir",
                                 str(run), meta.get("recipe"), meta.get("nodes"), s.requeues if s else 0))
    return out


def rank_log(job_id: str, rank: int, root: Path | None = None, stream: str = "out") -> Path:
    run = rundir.find_run(job_id, root)
    if run is None:
        raise HpcError(f"no run dir records job {job_id}", fix="check the id with `hpc jobs list`")
    # submitit names logs <job>_<rank>_log.out; an array task's <job> is "<array>_<task>".
    path = run / "submitit" / f"{job_id}_{rank}_log.{stream}"
    if not path.exists():
        have = sorted(p.name for p in (run / "submitit").glob(f"{job_id}_*_log.{stream}"))
        raise HpcError(f"no log for rank {rank} of job {job_id} in {run / 'submitit'}",
                       fix=f"logs there: {', '.join(have) or 'none yet (the job may not have started)'}")
    return path


def follow(path: Path, is_done, poll_s: float = 1.0) -> Iterator[str]:
    """Yield a log's lines as they are written, until is_done() and nothing new arrives."""
    with path.open() as fh:
        while True:
            line = fh.readline()
            if line:
                yield line
                continue
            if is_done():
                yield from fh
                return
            time.sleep(poll_s)
