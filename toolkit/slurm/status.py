"""Job state from Slurm, right with accounting and without it.

ParallelCluster ships without accounting by default, so `sacct` may answer "accounting storage is disabled".
Order: sacct (history, requeue count; for jobs it has not seen end, squeue's newer word) -> squeue -t all (jobs the
controller still holds) -> scontrol (restart count) -> nothing (the caller falls back to what the run dir recorded).
"""

from __future__ import annotations

import dataclasses
import enum
import re

from toolkit.errors import HpcError
from toolkit.slurm import commands


class State(enum.StrEnum):
    """A job's state as Slurm names it (squeue/sacct/scontrol; JOB STATE CODES), plus UNKNOWN: not known yet
    (accounting lags the controller) or a word this list lacks. A StrEnum: it prints and serialises as Slurm's
    own word."""

    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    SUSPENDED = "SUSPENDED"
    STOPPED = "STOPPED"
    SIGNALING = "SIGNALING"
    STAGE_OUT = "STAGE_OUT"
    RESIZING = "RESIZING"
    REQUEUED = "REQUEUED"
    REQUEUE_FED = "REQUEUE_FED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    REVOKED = "REVOKED"
    UNKNOWN = "UNKNOWN"

    @classmethod
    def parse(cls, word: str) -> State:
        """Slurm's word (sacct says "CANCELLED by 0": the first word counts); UNKNOWN for anything else."""
        first = word.split()[0] if word and word.split() else ""
        return cls.__members__.get(first, cls.UNKNOWN)

    @property
    def done(self) -> bool:
        return self in FINAL_STATES


FINAL_STATES = frozenset({State.COMPLETED, State.FAILED, State.CANCELLED, State.TIMEOUT, State.OUT_OF_MEMORY,
                          State.NODE_FAIL, State.PREEMPTED, State.BOOT_FAIL, State.DEADLINE, State.REVOKED})


def held(state: State, reason: str | None) -> bool:
    """Whether a job waits on a hold, which only `scontrol release` ends: an admin's or a user's (JobHeldAdmin,
    JobHeldUser: SchedMD/slurm src/common/job_state_reason.c) or one Slurm puts on a requeued job whose launch
    failed ("launch failed requeued held", "job requeued in held state", and since 25.05 "user env retrieval
    failed requeued held": src/slurmctld/job_mgr.c). Every reason that says "held" is such a hold."""
    return state == State.REQUEUE_HOLD or (not state.done and "held" in (reason or "").lower())


@dataclasses.dataclass
class JobStatus:
    job_id: str  # "123", or "123_4" for an array task
    state: State
    source: str  # sacct | squeue | scontrol
    exit_code: str | None = None
    nodes: str | None = None
    elapsed: str | None = None
    reason: str | None = None
    requeues: int = 0

    @property
    def done(self) -> bool:
        return self.state.done

    @property
    def array_id(self) -> str:
        return self.job_id.split("_")[0]


def array_task_ids(array_id: str, tasks: str) -> list[str]:
    """Slurm's compact task list ("4-199%4", "1,3,5-7") -> ["ID_4", ...] (the %N throttle is dropped)."""
    ids = []
    for part in tasks.split("%")[0].split(","):
        first, _, last = part.partition("-")
        if first.isdigit() and (not last or last.isdigit()):
            ids += [f"{array_id}_{i}" for i in range(int(first), int(last or first) + 1)]
    return ids


def _expand(job_id: str) -> list[str]:
    """"123_[4-9%2]" (tasks not started yet, one row) -> one id per task; other ids as they are."""
    match = re.fullmatch(r"(\d+)_\[([\d,%-]+)\]", job_id)
    return array_task_ids(match.group(1), match.group(2)) if match else [job_id]


def _from_sacct(job_ids: list[str]) -> dict[str, JobStatus] | None:
    res = commands.run(["sacct", "-X", "-n", "-P", "-D", "-j", ",".join(job_ids),
                        "-o", "JobID,State,ExitCode,Elapsed,NodeList,Reason"], check=False)
    if res.returncode != 0:
        return None  # accounting disabled or slurmdbd down: fall back
    found: dict[str, JobStatus] = {}
    pending: set[str] = set()  # ids known only from a "123_[4-9]" row
    for line in res.stdout.splitlines():
        fields = line.split("|")
        if len(fields) < 6:
            continue
        row_id, state, exit_code, elapsed, nodes, reason = fields[:6]
        expanded = _expand(row_id)
        if expanded != [row_id]:  # tasks not started share one row, whose range slurmdbd may update late:
            for job_id in expanded:  # a task's own row wins over it
                if job_id not in found or job_id in pending:
                    pending.add(job_id)
                    found[job_id] = JobStatus(job_id, State.parse(state), "sacct", reason=None)
            continue
        previous = None if row_id in pending else found.get(row_id)
        pending.discard(row_id)
        # -D lists every start of a job, oldest first: a row before this one is a start that was requeued, whatever
        # ended it (REQUEUED, PREEMPTED, NODE_FAIL: a node set down mid-job, which a probe counted as none)
        requeues = previous.requeues + 1 if previous else 0
        parsed = State.parse(state)
        # sacct's Reason is why the job last pended, kept once it runs (BeginTime after a requeue): not a reason then
        stale = parsed in (State.RUNNING, State.COMPLETING, State.COMPLETED)
        found[row_id] = JobStatus(row_id, parsed, "sacct", exit_code, nodes or None, elapsed,
                                  None if stale or reason in ("", "None") else reason, requeues)
    return found


def _from_squeue(job_ids: list[str]) -> dict[str, JobStatus]:
    res = commands.run(["squeue", "-h", "-r", "-t", "all", "-j", ",".join(job_ids), "-o", "%i|%T|%N|%M|%r"],
                       check=False)
    if commands.unreachable(res):
        raise commands.controller_down("no job state without it (and no accounting to ask instead)")
    found = {}
    for line in res.stdout.splitlines():
        fields = line.split("|")
        if len(fields) == 5:
            job_id, state, nodes, elapsed, reason = fields
            found[job_id] = JobStatus(job_id, State.parse(state), "squeue", None, nodes or None, elapsed,
                                      None if reason in ("", "None") else reason)
    return found


def scontrol_records(job_id: str) -> list[dict[str, str]]:
    """The controller's records of a job (`scontrol -o show job`: one per array task), field -> value; none once
    it has forgotten the job (MinJobAge after its end)."""
    res = commands.run(["scontrol", "-o", "show", "job", job_id], check=False)
    records = []
    for line in res.stdout.splitlines():
        record = {}
        for token in line.split():
            key, sep, value = token.partition("=")
            if sep:
                record[key] = value
        if "JobId" in record:
            records.append(record)
    return records


def _add_scontrol(job_ids: list[str], found: dict[str, JobStatus]) -> None:
    """Fill in restart counts (squeue has none) and jobs squeue did not list."""
    for job_id in job_ids:
        for rec in scontrol_records(job_id):
            task = rec.get("ArrayTaskId")
            keys = array_task_ids(rec["ArrayJobId"], task) if task and "ArrayJobId" in rec else [rec["JobId"]]
            for key in keys:  # a pending array's tasks share one record ("ArrayTaskId=4-199%4")
                status = found.get(key) or JobStatus(key, State.parse(rec.get("JobState", "")), "scontrol",
                                                     nodes=rec.get("NodeList"), elapsed=rec.get("RunTime"),
                                                     reason=rec.get("Reason"))
                status.requeues = int(rec.get("Restarts", "0") or 0)
                status.exit_code = rec.get("ExitCode", status.exit_code)
                found[key] = status


def _newer_from_the_controller(job_ids: list[str], found: dict[str, JobStatus]) -> None:
    """slurmdbd hears of a job's start and end after the controller does (slurmctld sends them as it can: a moment
    here, longer on a busy controller), so sacct can still say PENDING for a job that ran and failed, or lack a job
    just submitted. For the jobs sacct has not seen end (or has not seen at all), the controller's word, where it
    still holds them, is the newer one; sacct's requeue count stays (the controller's squeue has none)."""
    def listed(job_id: str) -> bool:
        return job_id in found or any(key.startswith(f"{job_id}_") for key in found)

    if all(status.done for status in found.values()) and all(listed(job_id) for job_id in job_ids):
        return
    try:
        controller = _from_squeue(job_ids)
    except HpcError:  # the controller is down: accounting's word is all there is
        return
    for key, status in controller.items():
        known = found.get(key)
        if known is None or known.state != status.state:
            status.requeues = known.requeues if known else 0
            found[key] = status


@dataclasses.dataclass
class Answer:
    jobs: dict[str, JobStatus]  # as query() returns them
    accounting: bool  # sacct answered: it forgets no job, so one it lacks is not recorded yet (it lags)


def ask(job_ids: list[str], restarts: bool = True, newest: bool = False) -> Answer:
    """Status of any number of jobs in ONE Slurm call (sacct, else squeue -r), plus, without accounting and with
    `restarts`, one scontrol per id for the restart counts squeue lacks (a sweep's summary goes without them), and
    with `newest`, one squeue for what accounting has not heard yet (a job's own status; a poll of a 10,000-task
    sweep or of every run stays one call, and a task accounting lags on is right at the next poll)."""
    found = _from_sacct(job_ids)
    if found is not None:
        if newest:
            _newer_from_the_controller(job_ids, found)
        return Answer(found, True)
    found = _from_squeue(job_ids)
    if restarts:
        _add_scontrol(job_ids, found)
    return Answer(found, False)


def query(job_ids: list[str]) -> dict[str, JobStatus]:
    """Status of each job (array jobs: each task, keyed "ID_TASK"), the controller's word where accounting lags it;
    jobs Slurm has forgotten are absent."""
    return ask(job_ids, newest=True).jobs
