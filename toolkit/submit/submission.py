"""`hpc recipes submit`: plan (toolkit.submit.plan) -> execute -> wait.

Nothing is left half done: the run dir is removed again when Slurm refuses the job.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from toolkit.errors import HpcError
from toolkit.submit.plan import SubmitRequest, execute, plan

if TYPE_CHECKING:
    from toolkit.rundir import RunDir

__all__ = ["SubmitRequest", "culprit", "failure_message", "submit", "torchrun_restart_lines", "wait"]


def submit(request: SubmitRequest, progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Plan and submit a recipe; returns the job id, run dir and warnings."""
    p = plan(request)
    for note in p.notes:
        progress(note)
    job_id = execute(p)
    return {"job_id": job_id, "run_dir": str(p.run_dir), "executor": p.executor, "queue": p.queue.name,
            "nodes": p.spec.nodes, "ranks": p.spec.world_size, "warnings": list(p.warnings)}


def wait(job_id: str, run: Path, progress: Callable[[str], None], poll_s: float = 1.0,
         timeout_s: float | None = None) -> dict[str, Any]:
    """Poll until the job ends; report state changes. Returns the final status and, on failure, the culprit."""
    from toolkit.node.preflight import awaiting_release
    from toolkit.rundir import RunDir
    from toolkit.slurm.status import State, held
    from toolkit.submit import runs
    from toolkit.slurm.batchhost import STAGE as LAUNCH, failure_line, recover

    start, last, announced = time.monotonic(), None, 0
    while True:
        status = runs.status(job_id)
        if status.state not in (last, State.UNKNOWN):  # UNKNOWN: Slurm's accounting has not caught up yet
            progress(f"job {job_id}: {status.state} after {time.monotonic() - start:.0f} s")
            last = status.state
        # A batch host that could not start the script: named, and the job requeued without it where it can be.
        recovery = recover(job_id, run, status.state, status.exit_code, status.reason) if status.done else None
        if status.done and not (recovery and recovery.pending):
            break
        records = RunDir(run).preflights(job_id)
        for record in records[announced:]:
            if record.get("failed"):
                progress(f"job {job_id}: {failure_line(record)}")
        announced = len(records)
        # Held by its own failed pre-flight, hpc-exclude-<job> releases it without the failed nodes; another hold
        # would last forever.
        if held(status.state, status.reason) and not awaiting_release(records):
            raise HpcError(f"job {job_id} is held by Slurm ({status.reason}): it will not start until released",
                           fix="Slurm >= 25.05 holds a job whose nodes cannot load the submitter's login environment "
                               "(`su - USER -c env`, which --export=LIST implies): fix that login, then "
                               f"`scontrol release {job_id}`; or cancel it with `hpc jobs cancel {job_id}`")
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            raise HpcError(f"job {job_id} did not finish within {timeout_s:.0f} s (still {status.state})",
                           fix=f"follow it with `hpc jobs status {job_id}`; cancel with `hpc jobs cancel {job_id}`")
        time.sleep(poll_s)
    outcome = {"job_id": job_id, "state": status.state, "run_dir": str(run), "requeues": status.requeues}
    ended = RunDir(run)
    mine = ended.preflights(job_id)
    if status.state != State.COMPLETED:
        outcome.update(culprit(job_id, ended))
    restarts = ended.torchrun_restarts(job_id)
    if restarts:
        outcome["torchrun_restarts"] = restarts
    launches = [r for r in mine if r.get("stage") == LAUNCH]
    if launches:  # starts that never ran the batch script (toolkit.slurm.batchhost), whatever came after
        outcome["launch_failures"] = launches
    return outcome


def culprit(job_id: str, ended: RunDir) -> dict[str, Any]:
    """What a job that did not complete says of why (`ended`: its RunDir): its first failed rank, read once (the
    rendered script's: from its one log), and that rank's log as RunDir.failed_rank_log chooses it, whatever
    executor ran the job; or the pre-flight that stopped it."""
    rank, node = ended.first_failure(job_id) or (None, None)
    log = ended.rank_log(job_id, rank or 0, "err")
    found: dict[str, Any] = {"failed_rank_log": str(log) if log else None, "failed_rank": rank, "failed_node": node,
                             # the rendered script's one log (every rank's lines, labelled): the failed rank's
                             # are read out of it
                             "failed_rank_log_shared": bool(log and ended.shares_log(job_id, log))}
    mine = ended.preflights(job_id)
    if mine and mine[-1].get("failed"):  # stopped by its pre-flight: that is the reason, not a rank's log
        found["preflight"] = mine[-1]
    return found


def failure_message(job_id: str, state: str, found: dict[str, Any]) -> str:
    """One line for a job that did not complete, from culprit()'s findings: the pre-flight's verdict, else the
    failed rank, its node and its own error line, the log to read and the command that prints that rank's lines."""
    from toolkit.slurm.batchhost import failure_line
    from toolkit.submit.runs import failure_reason

    log, rank, node = found.get("failed_rank_log"), found.get("failed_rank"), found.get("failed_node")
    # the rendered script's one log, its ranks' lines labelled (a pre-flight's stop is no rank's failure)
    shared = rank is not None and found.get("failed_rank_log_shared") and not found.get("preflight")
    reason = failure_reason(log, rank if shared else None) if log else None
    if found.get("preflight"):
        reason = failure_line(found["preflight"])
    elif rank is not None:
        # its node too: a failure that follows a node from job to job is what the fleet ledger is for
        reason = f"rank {rank}{f' on {node}' if node else ''} failed first" + (f": {reason}" if reason else "")
    lines = f"; rank {rank}'s lines: hpc jobs logs {job_id} --rank {rank}" if shared else ""
    return f"job {job_id} ended {state}" + (f": {reason}" if reason else "") + (f" (see {log}{lines})" if log else "")


def torchrun_restart_lines(restarts: list[dict[str, Any]]) -> list[str]:
    """torchrun's restarts of the workers (RunDir.torchrun_restarts), a line each: completed or not, a job pays
    for each in the steps it redid."""
    return [f"torchrun restarted the workers (restart {r['restart']} of {r['of']}) after a worker on {r['node']} "
            "failed" for r in restarts]
