"""Goodput: where every second of a job went, from its submission to its end, read from the run dir only.

The ledger is a partition of [submission, end] into segments of one kind each (KINDS), so its parts add up to the
wall time by construction; what no record explains is `unattributed`, and every record the run dir lacks is named in
`missing`. The evidence, all in the run dir:

  metadata.json      submitted_at: the start of the ledger (older run dirs lack it: the ledger then starts at the
                     first record and has no queue wait)
  preflight.jsonl    each start of the job: its pre-flight's end (`time`) and length (`seconds`), and whether it
                     requeued the job (toolkit.node.preflight)
  the step log       our trainer's logs/train_log.jsonl (start, train, val, checkpoint, end: toolkit.workloads.
                     train_log), else the JSON lines rank 0 of a user's script prints in the job's log with a `time`
                     (recipes/examples/ddp_train.py: rank_env, resumed, train, checkpoint, end), else a launcher's
                     program's own log with its times (LogReader.timed_records: fairseq's train_inner lines and
                     its "Saved checkpoint ... (writing took T seconds)")
  restarts.jsonl     the spares supervisor's restarts: what the fault was (toolkit.node.spares)
  hang.json          when the hang watchdog ended the job
  heartbeats/        the last write of each rank (the job's end), and a user script's checkpoint saves
                     (beat(step, checkpoint=seconds)) where its log has no checkpoint records
  result.json, failures/   how and when the ranks ended
  the logs' mtime    the job's end: its batch shell writes them after the ranks' last records (END_SLACK_S)

Steps are attributed by their step numbers: a step computed again later (after a restart or a requeue resumed from
an earlier checkpoint) was `lost`; in a run that did not complete, the steps after its last checkpoint are its
`tail`; every other step is `productive`. Time between two logged steps is step time, less the checkpoint saves
and validations inside it. Slurm's own records are never asked: a report reads run dirs only.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import signal
from collections.abc import Iterable, Sequence
from typing import Any

from toolkit.launchers.base import number, whole_number as _int
from toolkit.reports.training_logs import json_lines
from toolkit.rundir import TRAINER_LOG, Metadata, RankRecord, RunDir, task_lines

# The kinds of time, in the order a job meets them (the table's and the plot's order), with the plot's colour.
KINDS: dict[str, tuple[str, str]] = {
    "queue": ("queue wait: submitted, not started", "#b0b0b0"),
    "preflight": ("pre-flight checks", "#8c6bb1"),
    "requeue": ("requeued by a failed pre-flight, until the next start", "#c994c7"),
    "startup": ("start-up to the first step", "#fdae6b"),
    "productive": ("productive steps", "#31a354"),
    "checkpoint": ("checkpoint saves", "#3182bd"),
    "evaluation": ("validation", "#9ecae1"),
    "lost": ("steps redone after a restart or requeue", "#e6550d"),
    "downtime": ("fault to the next step", "#de2d26"),
    "hang": ("hung until the watchdog ended it", "#756bb1"),
    "tail": ("steps after the last checkpoint of a run that did not complete", "#fd8d3c"),
    "shutdown": ("after the last step to the end", "#bdbdbd"),
    "unattributed": ("no record says", "#f0f0f0"),
}
PAID_EXCLUDED = ("queue", "requeue")  # while pending the job holds no node
COMPLETED = ("completed", "max_steps")
STOPPED = "stopped"  # saved on a stop signal: nothing after its last step is lost
# The rank that ended first was killed (SIGTERM, SIGKILL) and none failed by itself before it: scancel, the time
# limit or a lost node ended the job; Slurm's state says which (`hpc jobs status`), the run dir does not. Its tail
# is lost as a failure's is.
SIGNALLED = "signalled"
ENDED_BADLY = ("failed", SIGNALLED)


@dataclasses.dataclass(frozen=True)
class Event:
    """One timed record of the step log."""

    time: float
    kind: str  # start | step | checkpoint | eval | end
    step: int | None = None
    seconds: float | None = None  # a step's interval's training time; a checkpoint save's time
    status: str | None = None  # an end's


@dataclasses.dataclass
class Attempt:
    """One run of the workload: from its start record (or its first step) to its last record."""

    start: float | None = None
    resumed_from: int | None = None
    steps: list[Event] = dataclasses.field(default_factory=list)
    checkpoints: list[Event] = dataclasses.field(default_factory=list)
    evals: list[Event] = dataclasses.field(default_factory=list)
    end: Event | None = None

    @property
    def resume_point(self) -> int | None:
        """The step it started after: its start record's, else one logged interval before its first step."""
        if self.resumed_from is not None:
            return self.resumed_from
        if not self.steps or self.steps[0].step is None:
            return None
        return max(0, self.steps[0].step - 1)


@dataclasses.dataclass(frozen=True)
class Segment:
    kind: str
    start: float
    end: float
    steps: float = 0.0  # steps computed in it (productive, lost, tail)
    attempt: int | None = None
    note: str = ""

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "seconds": round(self.seconds, 3)}


@dataclasses.dataclass(frozen=True)
class Fault:
    """A run's interruption: from its last step before the fault to the next step made."""

    at: float
    cause: str
    last_step: int | None
    resumed_from: int | None
    steps_lost: int
    lost_s: float
    downtime_s: float


@dataclasses.dataclass
class Ledger:
    run_dir: str
    recipe: str | None
    job_ids: list[str]
    start: float | None  # the submission (or, without it, the first record)
    end: float | None
    segments: list[Segment]
    faults: list[Fault]
    outcome: str  # completed | stopped | failed | signalled | unknown
    step_source: str | None
    missing: list[str]
    nodes_held: int | None = None
    gpus: int | None = None
    instance_type: str | None = None
    price_per_hour: float | None = None  # per node, on demand, from the catalog; None: no price
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def wall_s(self) -> float:
        return (self.end - self.start) if self.start is not None and self.end is not None else 0.0

    def totals(self) -> dict[str, float]:
        found = {kind: 0.0 for kind in KINDS}
        for segment in self.segments:
            found[segment.kind] += segment.seconds
        return found

    @property
    def productive_s(self) -> float:
        return self.totals()["productive"]

    @property
    def goodput(self) -> float | None:
        return self.productive_s / self.wall_s if self.wall_s > 0 else None

    @property
    def paid_s(self) -> float:
        """The time the job held its nodes: its wall time less the waits in the queue."""
        totals = self.totals()
        return self.wall_s - sum(totals[k] for k in PAID_EXCLUDED)

    def summary(self) -> dict[str, Any]:
        totals = self.totals()
        paid_h = self.paid_s / 3600
        held_gpus = self.gpus
        gpu_hours = paid_h * held_gpus if held_gpus else None
        productive_gpu_hours = self.productive_s / 3600 * held_gpus if held_gpus else None
        cost = paid_h * self.nodes_held * self.price_per_hour if self.price_per_hour and self.nodes_held else None
        return {
            "wall_s": round(self.wall_s, 3),
            "attributed_s": round(sum(totals.values()) - totals["unattributed"], 3),
            "unattributed_s": round(totals["unattributed"], 3),
            "seconds": {k: round(v, 3) for k, v in totals.items()},
            "goodput": None if self.goodput is None else round(self.goodput, 4),
            "paid_s": round(self.paid_s, 3),
            "goodput_paid": round(self.productive_s / self.paid_s, 4) if self.paid_s > 0 else None,
            "gpu_hours": None if gpu_hours is None else round(gpu_hours, 4),
            "productive_gpu_hours": None if productive_gpu_hours is None else round(productive_gpu_hours, 4),
            "cost_usd": None if cost is None else round(cost, 2),
            "productive_cost_usd": (round(cost * self.productive_s / self.paid_s, 2)
                                    if cost is not None and self.paid_s > 0 else None),
            "price": "no price" if self.price_per_hour is None else f"{self.price_per_hour:g} USD/h per node",
            "steps_lost": sum(f.steps_lost for f in self.faults),
            "faults": len(self.faults),
        }

    def to_json(self) -> dict[str, Any]:
        return {"run_dir": self.run_dir, "recipe": self.recipe, "job_ids": self.job_ids, "start": self.start,
                "end": self.end, "outcome": self.outcome, "step_source": self.step_source, "missing": self.missing,
                "notes": self.notes, "nodes_held": self.nodes_held, "gpus": self.gpus,
                "instance_type": self.instance_type, "price_per_hour": self.price_per_hour, **self.summary(),
                "segments": [s.to_json() for s in self.segments],
                "fault_list": [dataclasses.asdict(f) for f in self.faults]}


# -- reading the evidence -------------------------------------------------------------------------------------------

def _epoch(iso: str | None) -> float | None:
    if not iso:
        return None
    try:
        when = dt.datetime.fromisoformat(iso)
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)).timestamp()


def events_of(records: Iterable[dict[str, Any]]) -> list[Event]:
    """Timed events from JSON records: our trainer's (start, train, val, checkpoint, end) or a user script's with
    the same names (rank_env of rank 0 and resumed mark a start)."""
    found: list[Event] = []
    for record in records:
        when, event = number(record.get("time")), record.get("event")
        if when is None or not isinstance(event, str):
            continue
        if event == "start":
            found.append(Event(when, "start", _int(record.get("resumed_from_step"))))
        elif event == "rank_env" and _int(record.get("rank")) in (0, None):
            found.append(Event(when, "start"))
        elif event == "resumed" and _int(record.get("step")) is not None:
            found.append(Event(when, "resumed", _int(record.get("step"))))
        elif event == "train" and _int(record.get("step")) is not None:
            found.append(Event(when, "step", _int(record.get("step")), number(record.get("interval_seconds"))))
        elif event == "checkpoint":
            found.append(Event(when, "checkpoint", _int(record.get("step")), number(record.get("seconds"))))
        elif event == "val":
            found.append(Event(when, "eval", _int(record.get("step"))))
        elif event == "end":
            status = record.get("status")
            found.append(Event(when, "end", _int(record.get("step")), status=status if isinstance(status, str)
                               else None))
    return sorted(found, key=lambda e: e.time)


def step_events(run: RunDir) -> tuple[list[Event], str | None]:
    """The run's step log: our trainer's log, else the first of the run's logs whose rank 0 printed timed steps."""
    candidates = [run.path / TRAINER_LOG] + [p for p in run.log_files() if p != run.path / TRAINER_LOG]
    for path in candidates:
        if not path.is_file():
            continue
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        events = events_of(json_lines(text))
        if not any(e.kind == "step" for e in events):  # a launcher's program's own log (fairseq's)
            from toolkit.launchers.base import log_readers

            rank0 = "\n".join(task_lines(text.splitlines(), 0))
            for reader in log_readers():
                events = events_of(reader.timed_records(rank0))
                if any(e.kind == "step" for e in events):
                    break
        if any(e.kind == "step" for e in events):
            return events, str(path.relative_to(run.path))
    return [], None


def attempts_of(events: Sequence[Event]) -> list[Attempt]:
    """Split the step log at each start (and where the step number falls back without one)."""
    attempts: list[Attempt] = []
    current: Attempt | None = None
    for event in events:
        if event.kind == "start":
            current = Attempt(start=event.time, resumed_from=event.step)
            attempts.append(current)
            continue
        if event.kind == "resumed":
            if current is None or current.steps:
                current = Attempt(start=event.time)
                attempts.append(current)
            current.resumed_from = event.step
            continue
        if event.kind == "step" and current is not None and current.steps and event.step is not None and \
                current.steps[-1].step is not None and event.step <= current.steps[-1].step:
            current = None  # a step done again without a start record: a new attempt
        if current is None:
            current = Attempt()
            attempts.append(current)
        {"step": current.steps, "checkpoint": current.checkpoints, "eval": current.evals}.get(
            event.kind, []).append(event)
        if event.kind == "end":
            current.end = event
    return attempts


def _ended_by_a_signal(first: RankRecord | None) -> bool:
    """Whether the rank that failed first was killed by SIGTERM or SIGKILL (a launcher's exit code: minus the
    signal; a shell's: 128 plus it) rather than failing by itself."""
    killed = (signal.SIGTERM, signal.SIGKILL)
    return first is not None and first.exit_code in (*(-s for s in killed), *(128 + s for s in killed))


def _heartbeat_checkpoints(run: RunDir) -> list[Event]:
    """A user script's saves as its heartbeat records them (beat(step, checkpoint=seconds)): its last one."""
    found = []
    for beat in run.heartbeats():
        saved = beat.checkpoint
        if saved and saved.get("time") is not None:
            found.append(Event(float(saved["time"]), "checkpoint", _int(saved.get("step")),
                               number(saved.get("seconds"))))
    return found[:1]


# The job's logs are written until its batch shell ends, after the ranks' last records (the ranks' result times are
# whole seconds). Their modification time is the job's end unless the run dir was copied since (cp and scp reset
# it): an mtime more than this long after the last record is taken for a copy's and not used.
END_SLACK_S = 60.0


def _last_write(run: RunDir, end: float | None) -> float | None:
    """The newest modification time of the job's logs within END_SLACK_S after `end`, None without one."""
    if end is None:
        return None
    found = []
    for path in [*run.log_files(), *run.submitit_dir().glob("*.pkl")]:
        try:
            mtime = path.stat().st_mtime
        except OSError:
            continue
        if end < mtime <= end + END_SLACK_S:
            found.append(mtime)
    return max(found, default=None)


def nodes_held(run: RunDir) -> int | None:
    """The nodes the job holds (spares included): the script's #SBATCH --nodes."""
    for name in ("job.sbatch", "batch_script.sh"):
        try:
            text = (run.path / name).read_text(errors="replace")
        except OSError:
            continue
        found = re.search(r"^#SBATCH --nodes[= ](\d+)", text, re.M)
        if found:
            return int(found.group(1))
    return None


def hourly_price(instance_type: str | None) -> float | None:
    """The catalog's on-demand price per hour of one node of this type (toolkit.catalog.price: with its date and
    source); None where it lists none."""
    if not instance_type:
        return None
    from toolkit import catalog

    found = catalog.price(instance_type)
    return found.usd_per_hour if found else None


# -- the ledger -----------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Claim:
    kind: str
    start: float
    end: float
    steps: float = 0.0
    attempt: int | None = None
    note: str = ""
    requeued: bool = False


def _step_claims(attempts: list[Attempt], outcome: str) -> list[_Claim]:
    """Each attempt's step intervals, less its saves and validations, split into productive, lost and tail."""
    claims: list[_Claim] = []
    resumes = [a.resume_point for a in attempts]
    saved = max((c.step for a in attempts for c in a.checkpoints if c.step is not None), default=None)
    for index, attempt in enumerate(attempts):
        later = [r for r in resumes[index + 1:] if r is not None]
        redone_after = min(later) if later else None  # steps beyond this one were computed again later
        tail_after = saved if index == len(attempts) - 1 and outcome in ENDED_BADLY and saved is not None else None
        previous: Event | None = None
        for step in attempt.steps:
            if previous is None:
                if step.seconds is None:  # where the first step began is unknown: start-up holds it
                    previous = step
                    continue
                begin, first = step.time - step.seconds, attempt.resume_point or 0
            else:
                begin, first = previous.time, previous.step or 0
            claims += _interval(begin, step.time, first, step.step or first, attempt, index, redone_after, tail_after)
            previous = step
        last = attempt.steps[-1].time if attempt.steps else None
        for save in attempt.checkpoints:  # saves after the attempt's last step (a stop's, a final one)
            if last is None or save.time > last:
                claims.append(_Claim("checkpoint", save.time - (save.seconds or 0.0), save.time, attempt=index))
        for check in attempt.evals:
            if last is not None and check.time > last:
                claims.append(_Claim("evaluation", last, check.time, attempt=index))
    return claims


def _interval(begin: float, end: float, first: int, last: int, attempt: Attempt, index: int,
              redone_after: int | None, tail_after: int | None) -> list[_Claim]:
    """Steps (first, last] done in [begin, end]: the saves and a validation in it carved out, the rest split."""
    carved: list[tuple[float, float, str]] = []
    for check in attempt.evals:
        if begin < check.time <= end:
            carved.append((begin, check.time, "evaluation"))
    for save in attempt.checkpoints:
        if begin < save.time <= end and save.seconds:
            carved.append((max(begin, save.time - save.seconds), save.time, "checkpoint"))
    carved.sort()
    pieces, cursor, claims = [], begin, []
    for start, stop, kind in carved:
        start = max(start, cursor)
        if stop <= start:
            continue
        if start > cursor:
            pieces.append((cursor, start))
        claims.append(_Claim(kind, start, stop, attempt=index))
        cursor = stop
    if end > cursor:
        pieces.append((cursor, end))
    count = max(last - first, 0)
    cut = min(x for x in (redone_after, tail_after, last) if x is not None)
    kept = max(min(cut, last) - first, 0)
    gone = "lost" if redone_after is not None and cut == redone_after else "tail"
    parts = [(kind, n) for kind, n in (("productive", kept), (gone, count - kept)) if n > 0] or [("productive", 0)]
    # The steps' time in step order: the kept steps (the lower numbers) first, then the ones lost.
    total = sum(b - a for a, b in pieces)
    for kind, n in parts:
        seconds = total * n / count if count else total
        while seconds > 1e-9 and pieces:
            a, b = pieces[0]
            take = min(seconds, b - a)
            claims.append(_Claim(kind, a, a + take, steps=n * take / (total * n / count) if count else 0.0,
                                 attempt=index))
            seconds -= take
            pieces[0] = (a + take, b)
            if pieces[0][1] - pieces[0][0] <= 1e-9:
                pieces.pop(0)
    return claims


def ledger(run: RunDir) -> Ledger:
    meta = run.metadata() or Metadata()
    missing: list[str] = []
    notes: list[str] = []
    submitted = _epoch(meta.submitted_at)
    if submitted is None:
        missing.append("the submission time (metadata.json submitted_at): no queue wait; the ledger starts at the "
                       "first record")
    job_ids = list(meta.job_ids)
    preflights = run.preflights() if not job_ids else [r for j in job_ids for r in run.preflights(j)]
    if not preflights:
        missing.append("pre-flight records (preflight.jsonl): the job's start is its first step's")
    events, source = step_events(run)
    if source is None:
        missing.append("a step log (logs/train_log.jsonl, or timed JSON lines from rank 0): the running time "
                       "cannot be split")
    attempts = attempts_of(events)
    if not any(a.checkpoints for a in attempts):
        from_beats = _heartbeat_checkpoints(run)
        if from_beats and attempts:
            attempts[-1].checkpoints += from_beats
            notes.append("checkpoint saves from the heartbeat: only the last one is placed")
        elif attempts:
            missing.append("checkpoint records (the step log's `checkpoint` events, or beat(step, checkpoint=s)): "
                           "their time counts as steps")
    restarts = run.restarts()
    hang = run.hang()
    result, failures = run.result(), run.failures()

    ends = [status for a in attempts if a.end for status in [a.end.status]]
    if ends and ends[-1] in COMPLETED or (result is not None and result.ok):
        outcome = "completed"
    elif ends and ends[-1] == STOPPED:
        outcome = "stopped"
    elif hang is not None or any(r.get("kind") == "gave_up" and not r.get("requeued") for r in restarts) or any(
            str(r.get("action", "")).startswith("stopped") for r in preflights):
        outcome = "failed"  # our own watchdog, supervisor or pre-flight ended it (killing its ranks)
    elif _ended_by_a_signal(run.first_failed_record()):
        outcome = SIGNALLED
    elif failures or (result is not None and not result.ok):
        outcome = "failed"
    else:
        outcome = "unknown"

    claims: list[_Claim] = []
    for record in preflights:
        end, seconds = number(record.get("time")), number(record.get("seconds")) or 0.0
        if end is not None:
            action = str(record.get("action", ""))
            claims.append(_Claim("preflight", end - seconds, end, note=action, requeued=action.startswith("requeued")))
    claims += _step_claims(attempts, outcome)
    step_times = sorted(e.time for a in attempts for e in a.steps)
    hang_time = number(hang.get("time")) if hang else None
    if hang is not None and hang_time is not None:
        before = [t for t in step_times if t <= hang_time]
        began = before[-1] if before else hang_time - (number(hang.get("hang_timeout_s")) or 0.0)
        claims.append(_Claim("hang", began, hang_time, note="; ".join(hang.get("lines") or [])))
    claims.sort(key=lambda c: (c.start, c.end))

    times = [t for c in claims for t in (c.start, c.end)] + [e.time for e in events]
    times += [number(r.get("time")) or 0.0 for r in restarts]
    times += [b.time for b in run.heartbeats()]
    times += [t for t in (_epoch(r.finished_at) for r in [*([result] if result else []), *failures]) if t]
    end = max(times, default=None)
    written = _last_write(run, end)
    if end is not None and written is not None and written > end:
        if written - end >= 0.1:
            notes.append(f"the end is the job's logs' last write, {written - end:.1f} s after the last record")
        end = written
    start = submitted if submitted is not None else min((c.start for c in claims), default=None)
    nodes, gpus = nodes_held(run), meta.gpus
    ledger_ = Ledger(str(run.path), meta.recipe, job_ids, start, end, [], [], outcome, source, missing,
                     nodes or meta.nodes, gpus, meta.instance_type, hourly_price(meta.instance_type), notes)
    if start is None or end is None:
        return ledger_
    if gpus and nodes and meta.nodes and nodes > meta.nodes:
        ledger_.gpus = gpus * nodes // meta.nodes  # the spares' GPUs are paid for too
    ledger_.segments = _fill(claims, start, end, step_times, outcome)
    ledger_.faults = _faults(attempts, ledger_.segments, restarts, preflights, hang, hang_time)
    return ledger_


def _fill(claims: list[_Claim], start: float, end: float, step_times: list[float], outcome: str) -> list[Segment]:
    """The claims in time order, clipped so none overlaps, and every gap between them given its kind."""
    segments: list[Segment] = []
    cursor, previous = start, None
    first_step = step_times[0] if step_times else None
    for claim in claims:
        begin, stop = max(claim.start, cursor, start), min(claim.end, end)
        if begin > cursor:
            segments.append(Segment(_gap(cursor, previous, segments, first_step, outcome, step_times), cursor,
                                    begin))
        if stop > begin:
            segments.append(Segment(claim.kind, begin, stop, claim.steps, claim.attempt, claim.note))
            cursor = stop
        previous = claim
    if end > cursor:
        segments.append(Segment(_gap(cursor, previous, segments, first_step, outcome, step_times, last=True), cursor,
                                end))
    return _merged(segments)


def _gap(at: float, previous: _Claim | None, done: list[Segment], first_step: float | None, outcome: str,
         step_times: list[float], last: bool = False) -> str:
    if previous is None:  # before the first record: queued, unless no record follows to say when it started
        return "unattributed" if last else "queue"
    if previous.kind == "preflight" and previous.requeued:
        return "requeue"
    stepped_before = any(s.kind in ("productive", "lost", "tail") for s in done) or \
        (first_step is not None and first_step <= at)
    if not stepped_before:
        return "startup" if first_step is not None else "unattributed"
    if not last and any(t > at for t in step_times):
        return "downtime"
    if last or not any(t > at for t in step_times):
        return {"completed": "shutdown", STOPPED: "shutdown", SIGNALLED: "shutdown",
                "failed": "downtime"}.get(outcome, "unattributed")
    return "unattributed"


def _merged(segments: list[Segment]) -> list[Segment]:
    """Neighbours of one kind and attempt as one segment (a step interval is one claim each)."""
    merged: list[Segment] = []
    for s in segments:
        if merged and merged[-1].kind == s.kind and merged[-1].attempt == s.attempt and \
                abs(merged[-1].end - s.start) < 1e-6 and merged[-1].note == s.note:
            m = merged[-1]
            merged[-1] = Segment(s.kind, m.start, s.end, m.steps + s.steps, m.attempt, m.note)
        else:
            merged.append(s)
    return merged


def _faults(attempts: list[Attempt], segments: list[Segment], restarts: list[dict], preflights: list[dict],
            hang: dict | None, hang_time: float | None) -> list[Fault]:
    stepped = [(i, a) for i, a in enumerate(attempts) if a.steps]
    faults = []
    for (index, before), (_, after) in zip(stepped, stepped[1:], strict=False):
        at, resumed = before.steps[-1].time, after.resume_point
        nxt = min(s.start for s in segments if s.attempt is not None and s.attempt > index and
                  s.kind in ("productive", "lost", "tail"))
        between = [r for r in restarts if r.get("kind") == "restart" and at <= (number(r.get("time")) or 0) <= nxt]
        requeues = [r for r in preflights if at <= (number(r.get("time")) or 0) <= nxt]
        if between:
            cause = f"restart on a spare: {between[0].get('trigger') or between[0].get('why')}"
        elif hang_time is not None and at <= hang_time <= nxt:
            cause = "hang: " + "; ".join((hang or {}).get("lines") or ["no progress"])
        elif requeues:
            cause = "requeued (the job started again: pre-flight at its start)"
        else:
            cause = "restarted (no record of why)"
        last = before.steps[-1].step
        lost = sum(s.seconds for s in segments if s.attempt == index and s.kind == "lost")
        steps_lost = max((last or 0) - (resumed or 0), 0) if last is not None and resumed is not None else 0
        faults.append(Fault(at, cause, last, resumed, steps_lost, round(lost, 3), round(nxt - at, 3)))
    return faults


def ledgers(runs: Iterable[RunDir]) -> list[Ledger]:
    return [ledger(run) for run in runs]


def totals(found: Sequence[Ledger]) -> dict[str, Any]:
    """Across runs: the seconds of each kind, and goodput over all of them."""
    seconds = {kind: sum(led.totals()[kind] for led in found) for kind in KINDS}
    wall = sum(led.wall_s for led in found)
    paid = sum(led.paid_s for led in found)
    costs = [led.summary()["cost_usd"] for led in found]
    return {"runs": len(found), "wall_s": round(wall, 3), "paid_s": round(paid, 3),
            "seconds": {k: round(v, 3) for k, v in seconds.items()},
            "goodput": round(seconds["productive"] / wall, 4) if wall > 0 else None,
            "goodput_paid": round(seconds["productive"] / paid, 4) if paid > 0 else None,
            "cost_usd": round(sum(c for c in costs if c is not None), 2) if any(c is not None for c in costs)
            else None}

