"""Training logs -> throughput, loss curve, updates: a launcher's program's own log and our ResNet trainer's log.

A launcher whose program writes a training log reads it itself (toolkit.launchers.base.LogReader, the launcher's
log_reader(): its records, its throughput rule, its warm-up): this module tries each reader, then our trainer's
format, and summarises what was found the same way for both.

Our ResNet trainer (toolkit.workloads.resnet): rank 0's `train_log.jsonl`, one JSON object per line with an
`event` of start | train | val | checkpoint | end (toolkit.workloads.train_log documents the fields). A
requeued run appends to the same file: one `start` per attempt, and steps after the last checkpoint are logged
again; the curves keep the last record of each step. Throughput is the trainer's own rule
(train_log.steady_throughput): images over training seconds, leaving out the first interval after each start.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from toolkit.errors import HpcError
from toolkit.rundir import task_lines
from toolkit.launchers.base import LogPoint, LogReader, json_object, log_readers, number as _num, whole_number as _int
from toolkit.workloads.train_log import steady_throughput

# Our trainer's events and the numeric fields each needs to be usable (steady_throughput reads the interval ones).
TRAINER_REQUIRED = {"start": (), "train": ("step", "interval_images", "interval_seconds"), "val": ("step",),
                    "checkpoint": (), "end": ()}


@dataclasses.dataclass
class TrainingLog:
    format: str  # a launcher's log reader's name, or "resnet" (our trainer)
    unit: str  # "words/s" or "images/s"
    loss_base: str  # the reader's, or "e"
    step_kind: str  # the per-interval kind of the loss curve
    points: list[LogPoint]  # the last record of each (kind, update), in log order
    records: list[dict] = dataclasses.field(default_factory=list)  # our trainer's records, all, in file order
    source: str = ""


def _reader(name: str) -> LogReader:
    return next(reader for reader in log_readers() if reader.name == name)


def unreadable_fix(texts: Iterable[str]) -> str | None:
    """The fix for logs that a launcher's program wrote but that hold no records its reader can read (e.g. the
    program logged no intervals), or None when no text is such a program's output."""
    return next((reader.fix for reader in log_readers() for text in texts if reader.recognises(text)), None)


def programs() -> str:
    """The programs whose own logs the reports read, in messages: "A or B"."""
    return " or ".join(reader.name for reader in log_readers())


def interval_flags() -> str:
    """The option each of those programs logs training intervals with, in messages: "A: --flag"."""
    return "; ".join(f"{reader.name}: {reader.interval_flag}" for reader in log_readers())


def _is_trainer_record(obj: dict) -> bool:
    event = obj.get("event")
    required = TRAINER_REQUIRED.get(event) if isinstance(event, str) else None
    return required is not None and all(_num(obj.get(key)) is not None for key in required)


def _trainer_point(record: dict) -> LogPoint:
    return LogPoint(kind=record["event"], update=_int(record.get("step")), epoch=_num(record.get("epoch")),
                    loss=_num(record.get("loss")), rate=_num(record.get("images_per_sec")),
                    wall=_num(record.get("elapsed")), values=record)


def last_per_update(points: list[LogPoint]) -> list[LogPoint]:
    """One point per (kind, update), the last logged: a restarted run logs the steps after its checkpoint again."""
    kept: dict = {}
    for index, point in enumerate(points):
        kept[(point.kind, point.update if point.update is not None else f"#{index}")] = point
    return list(kept.values())


def json_lines(text: str) -> list[dict]:
    """The JSON objects of a log's rank 0 lines: of a log every rank wrote with `srun --label` (the rendered
    script's one job log), task 0's without the label; of any other log, every line (rundir.task_lines)."""
    found = []
    for line in task_lines(text.splitlines(), 0):
        stripped = line.strip()
        obj = json_object(stripped) if stripped.startswith("{") else None
        if obj is not None:
            found.append(obj)
    return found


def parse_training_text(text: str, source: str = "") -> TrainingLog | None:
    """The training records in a log (a launcher's program's or our trainer's), or None if it holds none; rank 0's
    lines of a log every rank wrote with `srun --label`."""
    rank0 = "\n".join(task_lines(text.splitlines(), 0))
    for reader in log_readers():
        points = reader.points(rank0)
        if points:
            return TrainingLog(reader.name, reader.unit, reader.loss_base, reader.step_kind, last_per_update(points),
                               source=source)
    records = [obj for obj in json_lines(text) if "event" in obj and _is_trainer_record(obj)]
    if records:
        points = [_trainer_point(r) for r in records if r["event"] in ("train", "val")]
        return TrainingLog("resnet", "images/s", "e", "train", last_per_update(points), records, source=source)
    return None


def parse_training_file(path: str | Path) -> TrainingLog:
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        raise HpcError(f"no such file: {path}", fix="check the path of the training log") from None
    log = parse_training_text(text, str(path))
    if log is None:
        wanted = " or ".join(reader.wanted for reader in log_readers())
        raise HpcError(f"no training records in {path}", fix=unreadable_fix([text]) or
                       f"pass rank 0's log of {wanted} or the ResNet trainer's train_log.jsonl")
    return log


def _trainer_throughput(records: list[dict]) -> tuple[float | None, str]:
    how = "images / training seconds (checkpoint saves and validation excluded)"
    starts = sum(r["event"] == "start" for r in records)
    rate = steady_throughput(records)
    if rate is not None and starts:
        return rate, f"first interval after each of {starts} start(s) excluded as warm-up; {how}"
    if rate is not None:
        return rate, f"no start record: no warm-up excluded; {how}"
    rate = steady_throughput([r for r in records if r["event"] != "start"])
    if rate is not None:
        return rate, f"too few log records to exclude warm-up: all intervals used; {how}"
    return None, "no training intervals in the log"


def throughput(log: TrainingLog, warmup: int = 1) -> tuple[float | None, str]:
    """Post-warm-up throughput (see the module docstring) and a sentence saying how it was computed.

    `warmup` (logged intervals dropped) applies to a launcher's log (its reader's rule); our trainer's rule is its
    own.
    """
    return _trainer_throughput(log.records) if log.format == "resnet" else _reader(log.format).throughput(log.points,
                                                                                                         warmup)


def summarize_training(log: TrainingLog, warmup: int = 1) -> dict:
    """Throughput, updates, loss and validation curves of a parsed log, as plain JSON-ready values.

    epochs: a launcher's log's last epoch number (1-based, the last may be partial); our trainer's epochs completed.
    rate_curve rows are [update, rate of the interval ending there] (warm-up included: the plot shows it);
    valid_curve rows are [update, loss, top1] (top1 in %, None where the log has none); the `end` record, the trainer's
    own summary of its last attempt, is `trainer_summary`.
    """
    rate, note = throughput(log, warmup)
    train = [p for p in log.points if p.kind == log.step_kind]
    valid = [p for p in log.points if p.kind not in (log.step_kind, "train")]
    ends = [r for r in log.records if r["event"] == "end"]
    end = ends[-1] if ends else None
    updates = max((p.update for p in log.points if p.update is not None), default=_int((end or {}).get("step")))
    epochs: float | None
    if log.format == "resnet":
        epochs = max([int(p.epoch) + 1 for p in valid if p.epoch is not None]
                     + [_int(e.get("epoch")) or 0 for e in ends], default=0)
    else:
        epochs = max((p.epoch for p in log.points if p.epoch is not None), default=None)
    top1 = [_num(p.values.get("top1")) for p in valid if _num(p.values.get("top1")) is not None]
    return {
        "format": log.format, "source": log.source, "unit": log.unit, "throughput": rate, "throughput_note": note,
        "updates": updates, "epochs": epochs,
        "final_loss": next((p.loss for p in reversed(train) if p.loss is not None), None),
        "loss_base": log.loss_base,
        "loss_curve": [[p.update, p.loss] for p in train if p.loss is not None],
        "rate_curve": [[p.update, p.rate] for p in train if p.rate is not None],  # each logged interval's rate
        "valid_curve": [[p.update, p.loss, _num(p.values.get("top1"))] for p in valid if p.loss is not None],
        "final_top1": top1[-1] if top1 else _num((end or {}).get("top1")),
        "starts": sum(r["event"] == "start" for r in log.records) if log.format == "resnet" else None,
        "status": end.get("status") if end else None,
        "trainer_summary": end,
    }
