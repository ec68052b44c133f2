"""A job whose batch host could not start its batch script, named and requeued without that node from the submit
side (issue 30).

Slurm opens the job's output file (in the run dir) on the batch host before the batch script runs. Where that
node cannot write the run dir (its shared file system missing, or read-only there), the job ends at once, before
the pre-flight (toolkit.node.preflight, the script's first step) can look: measured on Slurm 22.05 (the local lane,
testbench.faults.missing_mount on the batch host), slurmd logs "Could not open stdout file ...: IO setup failed"
on that node only, and the controller records JobState=FAILED, Reason=JobLaunchFailure, ExitCode=0:53,
BatchHost=<node>; accounting keeps the job row (FAILED, 0:53) and its `.batch` step row (the batch host in
NodeList). The job's logs hold nothing, Slurm does not requeue it (even with --requeue) and leaves the node in
service. Nothing can run on that node to say so (it cannot write the run dir), so the submitter reads Slurm's
records: `hpc jobs status` and `hpc recipes submit --wait` call recover().

recover() writes a record for the failed start in the run dir's pre-flight records (stage "launch", the same shape
as the pre-flight's, so `hpc jobs status` and --wait show it alike) and, for a requeue-able job, requeues it
without the node: while the controller still holds the finished job (MinJobAge), `scontrol requeuehold` puts it
back pending and held (measured: a FAILED --requeue job goes to PENDING, "job requeued in held state", Restarts
+1; a --no-requeue one answers "Requested operation is presently disabled"), then its ExcNodeList gets the node
and `scontrol release` lets it start again: the same job id and run dir. The job is not running, so no helper job
is needed (the pre-flight needs hpc-exclude-<job> only because a running job's ExcNodeList cannot change).
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from toolkit.node import preflight
from toolkit.node.preflight import MAX_REQUEUES, excluded_now, one_line, room_after_excluding
from toolkit.node.records import PREFLIGHTS, append_record, batch_dir, job_records
from toolkit.node.slurm import SlurmCommandError, hostnames
from toolkit.slurm import commands
from toolkit.slurm import status as slurm_status
from toolkit.slurm.status import State

LAUNCH_EXIT_CODE = "0:53"  # slurmstepd's batch step failed before the script ran (signal 53)
LAUNCH_REASON = "JobLaunchFailure"
STAGE = "launch"  # the record's stage: before the batch script (the pre-flight's records have none)
CHECK = "batch-host"


@dataclasses.dataclass
class Recovery:
    record: dict[str, Any]  # the failed start's record (in the run dir's pre-flight records)
    pending: bool  # the job is back in Slurm's queue: a waiter goes on waiting


def is_launch_failure(state: State, exit_code: str | None, reason: str | None) -> bool:
    return state == State.FAILED and (exit_code == LAUNCH_EXIT_CODE or reason == LAUNCH_REASON)


def batch_host_from_accounting(job_id: str) -> str | None:
    """The batch host of the job's last start: its last `.batch` step row's node (sacct -D lists the starts in
    order, each job row followed by its steps)."""
    res = commands.run(["sacct", "-n", "-P", "-D", "-j", job_id, "-o", "JobID,NodeList"], check=False)
    host = None
    for line in res.stdout.splitlines() if res.returncode == 0 else []:
        row, _, nodes = line.partition("|")
        if row == job_id:
            host = None  # a later start: its own .batch row follows, if it got that far
        elif row == f"{job_id}.batch" and nodes:
            host = nodes
    return host


def failed_check(output: str | None, exit_code: str | None, reason: str | None) -> dict[str, Any]:
    opened = f"the job's output file {output}" if output else "the job's output file"
    said = ", ".join(word for word in (reason, f"exit code {exit_code}" if exit_code else None) if word)
    return {"name": CHECK, "status": "FAIL",
            "detail": f"Slurm could not start the batch script on this node ({said}): it cannot open {opened}, "
                      "so this node cannot write the run dir",
            "fix": "the shared file system is not mounted there (or mounted read-only): check the node's mounts "
                   "(`findmnt`) against the others' and drain it until it is fixed"}


def _scontrol(*words: str) -> str | None:
    """None when it worked, else what scontrol said."""
    res = commands.run(["scontrol", *words], check=False)
    return None if res.returncode == 0 else ((res.stderr or res.stdout).strip() or f"exit {res.returncode}")


def requeue_excluding(job_id: str, node: str) -> str:
    """Requeue the finished job held, add `node` to its ExcNodeList, release it; returns what was done."""
    exclude = sorted(set(excluded_now(job_id)) | {node})
    error = _scontrol("requeuehold", job_id)
    if error:
        raise RuntimeError(f"scontrol requeuehold {job_id}: {error}")
    error = _scontrol("update", f"JobId={job_id}", f"ExcNodeList={','.join(exclude)}")
    released = _scontrol("release", job_id)  # held by us: never leave it so
    if released:
        raise RuntimeError(f"scontrol release {job_id}: {released} (the job is held: `scontrol release {job_id}`)")
    if error:
        return f"requeued, but not excluding {node} (scontrol update: {error})"
    return f"requeued, excluding {','.join(exclude)} (by hpc on the submit side)"


def decide(job: dict[str, str] | None, node: str | None, output: str | None, earlier: int) -> str | None:
    """Why the job is not requeued, or None to requeue it. `job`: the controller's record of it."""
    if job is None:
        return "Slurm no longer holds the finished job (MinJobAge): resubmit it"
    if job.get("Requeue") == "0":
        return "a benchmark is not requeued"
    if node is None:
        return "Slurm did not say which node was the batch host"
    if output and not os.access(Path(output).parent, os.W_OK):
        return f"{Path(output).parent} cannot be written from here either: not one node's fault"
    if earlier >= MAX_REQUEUES:
        return f"{earlier} requeue(s) for failed starts already"
    nodes = int(job["NumNodes"]) if job.get("NumNodes", "").isdigit() else None
    partition = job.get("Partition")
    room = room_after_excluding(job["JobId"], partition, [node]) if partition else None
    if nodes and room is not None and room < nodes:
        return f"excluding {node} would leave the partition {room} node(s) for it"
    return None


def failure_line(record: dict[str, Any]) -> str:
    """A failed record in one line: `launch FAILED on w1: batch-host: ...; requeued, ...` for a failed start,
    else the pre-flight's own line."""
    if record.get("stage") != STAGE:
        return preflight.failure_line(record)
    return f"{STAGE} FAILED on {one_line(record['failed'])}; {record.get('action')}"


def summary_lines(records: list[dict[str, Any]]) -> list[str]:
    """`hpc jobs status`'s lines for a job's starts: the failed launches' and the pre-flights', in order."""
    lines = []
    for r in records:
        if r.get("stage") == STAGE:
            lines += [f"  {STAGE}: FAILED on {one_line(r['failed'])}", f"    then: {r.get('action')}"]
        else:
            lines += preflight.summary_lines([r])
    return lines


def _hostnames(nodelist: str) -> list[str]:
    try:
        return hostnames(nodelist)
    except SlurmCommandError:  # a slow controller: the record keeps Slurm's compact list
        return [nodelist]


def recover(job_id: str, run_dir: str | Path, state: State, exit_code: str | None,
            reason: str | None) -> Recovery | None:
    """When job `job_id` ended FAILED because its batch host could not start the batch script: the failed start's
    record (written once per start) after requeueing the job without that node where Slurm and the job allow it;
    None for any other end."""
    if not is_launch_failure(state, exit_code, reason):
        return None
    path = batch_dir(run_dir) / PREFLIGHTS
    launches = [r for r in job_records(path, job_id) if r.get("stage") == STAGE]
    jobs = [r for r in slurm_status.scontrol_records(job_id) if r.get("JobId") == job_id.split("_")[0]
            or f"{r.get('ArrayJobId')}_{r.get('ArrayTaskId')}" == job_id]
    job = jobs[0] if jobs else None
    live = State.parse(job.get("JobState", "")) if job else None
    if live is not None and not live.done:  # back in the queue (accounting lags the controller)
        return Recovery(launches[-1], True) if launches else None
    restarts = int(job.get("Restarts", "0") or 0) if job else None
    if launches and (job is None or launches[-1].get("restarts") == restarts):
        return Recovery(launches[-1], False)  # this start's failure was recorded already
    if job is not None and not is_launch_failure(State.parse(job.get("JobState", "")), job.get("ExitCode"),
                                                 job.get("Reason")):
        return None
    node = (job or {}).get("BatchHost") or batch_host_from_accounting(job_id)
    output = (job or {}).get("StdOut")
    earlier = [r for r in job_records(path, job_id) if str(r.get("action", "")).startswith("requeued")]
    why_not = decide(job, node, output, len(earlier))
    pending = False
    if why_not is None and job is not None:
        try:
            action = requeue_excluding(job_id, node or "")
            pending = True
        except RuntimeError as exc:
            again = [r for r in slurm_status.scontrol_records(job_id) if r.get("JobId") == job["JobId"]]
            if again and not State.parse(again[0].get("JobState", "")).done:  # another `hpc` requeued it first
                return Recovery(launches[-1], True) if launches else None
            action = f"stopped: the requeue failed: {exc}"
    else:
        action = f"stopped: {why_not}"
    name = node or "the batch host"
    nodes = (job or {}).get("NodeList")
    record = {"job": job_id, "stage": STAGE, "time": time.time(), "seconds": 0,
              "nodes": _hostnames(nodes) if nodes and nodes != "(null)" else [name], "restarts": restarts,
              "failed": {name: [failed_check(output, exit_code or (job or {}).get("ExitCode"),
                                             reason or (job or {}).get("Reason"))]},
              "left_out": [], "action": action}
    append_record(path, record)
    return Recovery(record, pending)
