"""Training logs -> throughput, loss curve, updates: fairseq's JSON log lines and our ResNet trainer's log.

fairseq (`--log-format json`): `<time> | INFO | train_inner | {json}` on stdout (`--log-file` writes the bare
JSON). Every value is a string except epoch; loss is base 2; wps of the first logged interval is "0" (start-up);
wpb and wps are summed over ranks and only rank 0 logs. Kinds: train_inner (plain keys), train (keys prefixed
`train_`, end of epoch), valid (prefixed `valid_`). Throughput: the first `warmup` train_inner intervals are
dropped (start-up, data loading, the first slow iterations; fairseq even logs wps "0" there) and the rest are
averaged weighted by each interval's time, i.e. words done / time spent after warm-up: from the `wall` clock,
or, where whole-second `wall` values cannot tell short intervals apart, from its updates / `ups`.
fairseq's other text formats are read too: `--log-format simple` (the default without a TTY) logs
`<time> | INFO | train_inner | epoch 001:    100 / 487 loss=4.655, ..., num_updates=100, ...` per interval and
`<time> | INFO | valid | epoch 001 | valid on 'valid' subset | loss 2.001 | ... | num_updates 100` at epoch
ends; fairseq <= 0.9 wrote the same without the time/level/tag (`| epoch 001:     10 / 31621 loss=15.180, ...`).
`--log-format none` and `tqdm` (on a TTY) leave no per-interval records: such a log gets an error saying
to use `--log-format json`.

Our ResNet trainer (toolkit.workloads.resnet): rank 0's `train_log.jsonl`, one JSON object per line with an
`event` of start | train | val | checkpoint | end (toolkit.workloads.train_log documents the fields). A
requeued run appends to the same file: one `start` per attempt, and steps after the last checkpoint are logged
again; the curves keep the last record of each step. Throughput is the trainer's own rule
(train_log.steady_throughput): images over training seconds, leaving out the first interval after each start.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from toolkit.errors import HpcError
from toolkit.workloads.train_log import steady_throughput

_FAIRSEQ_TAGGED = re.compile(r"\|\s*[A-Z]+\s*\|\s*([\w.]+)\s*\|\s*(\{.*\})\s*$")
# --log-format simple (and fairseq <= 0.9): per-interval `epoch 001:    100 / 487 k=v, k=v` (commas) and
# end-of-epoch `epoch 001 | [valid on 'SUBSET' subset | ]k v | k v` (pipes).
_FAIRSEQ_COMMAS = re.compile(r"(?:^|\| )epoch (\d+):\s+\d+ / \d+ (\w+=.*)$")
_FAIRSEQ_PIPES = re.compile(r"(?:^|\| )epoch (\d+) \| (?:valid on '([\w.-]+)' subset \| )?(\w+ .*)$")
FAIRSEQ_FIX = ("fairseq wrote no per-interval records this report can read (--log-format none, or tqdm on a "
               "terminal): train with --log-format json (or simple) and a --log-interval")

# Our trainer's events and the numeric fields each needs to be usable (steady_throughput reads the interval ones).
TRAINER_REQUIRED = {"start": (), "train": ("step", "interval_images", "interval_seconds"), "val": ("step",),
                    "checkpoint": (), "end": ()}


@dataclasses.dataclass
class LogPoint:
    kind: str  # fairseq: train_inner / train / valid (or another subset); our trainer: train / val
    update: int | None
    epoch: float | None
    loss: float | None
    rate: float | None  # words/s or images/s over the logged interval
    wall: float | None  # seconds since start
    values: dict


@dataclasses.dataclass
class TrainingLog:
    format: str  # "fairseq" or "resnet"
    unit: str  # "words/s" or "images/s"
    loss_base: str  # "2" (fairseq) or "e"
    step_kind: str  # the per-interval kind of the loss curve
    points: list[LogPoint]  # the last record of each (kind, update), in log order
    records: list[dict] = dataclasses.field(default_factory=list)  # our trainer's records, all, in file order
    source: str = ""


def _num(value) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _int(value) -> int | None:
    number = _num(value)
    return int(number) if number is not None else None


def _fairseq_point(obj: dict, tag: str | None) -> LogPoint | None:
    if tag is None:  # --log-file: no tag; the key prefixes say the kind
        tag = "valid" if any(k.startswith("valid_") for k in obj) else "train" if "train_loss" in obj else "train_inner"
    prefix = "" if tag == "train_inner" else f"{tag}_"
    values = {k[len(prefix):] if prefix and k.startswith(prefix) else k: v for k, v in obj.items()}
    if "loss" not in values and "wps" not in values:
        return None
    return LogPoint(kind=tag, update=_int(values.get("num_updates")), epoch=_num(values.get("epoch")),
                    loss=_num(values.get("loss")), rate=_num(values.get("wps")), wall=_num(values.get("wall")),
                    values=values)


def _fairseq_text_point(line: str) -> LogPoint | None:
    """A record of fairseq's simple / legacy text formats (see the module docstring), or None."""
    if m := _FAIRSEQ_COMMAS.search(line):
        epoch, items, sep, tag = m.group(1), m.group(2).split(", "), "=", "train_inner"
    elif m := _FAIRSEQ_PIPES.search(line):
        epoch, items, sep, tag = m.group(1), m.group(3).split(" | "), " ", m.group(2) or "train"
    else:
        return None
    pairs = (item.split(sep, 1) for item in items if sep in item)
    return _fairseq_point({"epoch": int(epoch), **{k.strip(): v.strip() for k, v in pairs}}, tag)


def looks_like_fairseq(text: str) -> bool:
    """fairseq's own logger names (fairseq_cli.train, fairseq.trainer) appear in every format's stdout."""
    return "fairseq_cli." in text or "| fairseq." in text


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


def _json_object(text: str) -> dict | None:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def parse_training_text(text: str, source: str = "") -> TrainingLog | None:
    """The training records in a log (fairseq or our trainer), or None if it holds none."""
    fairseq: list[LogPoint] = []
    records: list[dict] = []
    for line in text.splitlines():
        tagged = _FAIRSEQ_TAGGED.search(line)
        if tagged:
            obj = _json_object(tagged.group(2))
            if obj is not None and (point := _fairseq_point(obj, tagged.group(1))):
                fairseq.append(point)
            continue
        stripped = line.strip()
        obj = _json_object(stripped) if stripped.startswith("{") else None
        if obj is None:
            if "epoch" in line and (point := _fairseq_text_point(stripped)):
                fairseq.append(point)
            continue
        if "event" in obj:
            if _is_trainer_record(obj):
                records.append(obj)
        elif point := _fairseq_point(obj, None):
            fairseq.append(point)
    if fairseq:
        return TrainingLog("fairseq", "words/s", "2", "train_inner", last_per_update(fairseq), source=source)
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
        raise HpcError(f"no training records in {path}", fix=FAIRSEQ_FIX if looks_like_fairseq(text) else
                       "pass rank 0's log of fairseq (--log-format json or simple) or the ResNet trainer's "
                       "train_log.jsonl")
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


def _fairseq_throughput(log: TrainingLog, warmup: int) -> tuple[float | None, str]:
    steps = [(p, p.rate) for p in log.points if p.kind == log.step_kind and p.rate is not None]
    if not steps:
        return None, "no per-interval rates in the log"
    previous: list[LogPoint | None] = [None, *(p for p, _ in steps[:-1])]
    # (previous record, record, its rate)
    intervals = [(a, b, rate) for a, (b, rate) in zip(previous, steps, strict=True)]
    kept, note = intervals[warmup:], f"first {warmup} logged interval(s) excluded as warm-up"
    if not kept:
        kept, note = intervals, "too few log records to exclude warm-up: all intervals used"
    kept = [(a, b, rate) for a, b, rate in kept if rate > 0] or kept
    for how, span in (("wall time", _wall_span), ("updates / ups", _ups_span)):
        spans = [s for a, b, _ in kept if (s := span(a, b)) is not None and s > 0]
        if len(spans) == len(kept):  # every interval has its span
            weighted = sum(rate * s for (_, _, rate), s in zip(kept, spans, strict=True)) / sum(spans)
            return weighted, f"{note}; weighted by interval {how}"
    return sum(rate for _, _, rate in kept) / len(kept), note + "; plain mean of the interval rates"


def _wall_span(a: LogPoint | None, b: LogPoint) -> float | None:
    return b.wall - a.wall if a is not None and a.wall is not None and b.wall is not None else None


def _ups_span(a: LogPoint | None, b: LogPoint) -> float | None:
    """An interval's training seconds from its updates per second (fairseq's `wall` is whole seconds)."""
    ups = _num(b.values.get("ups"))
    if a is None or a.update is None or b.update is None or not ups:
        return None
    return (b.update - a.update) / ups


def throughput(log: TrainingLog, warmup: int = 1) -> tuple[float | None, str]:
    """Post-warm-up throughput (see the module docstring) and a sentence saying how it was computed.

    `warmup` (logged intervals dropped) applies to fairseq; our trainer's rule is its own.
    """
    return _trainer_throughput(log.records) if log.format == "resnet" else _fairseq_throughput(log, warmup)


def summarize_training(log: TrainingLog, warmup: int = 1) -> dict:
    """Throughput, updates, loss and validation curves of a parsed log, as plain JSON-ready values.

    epochs: fairseq's last epoch number (1-based, the last may be partial); our trainer's epochs completed.
    rate_curve rows are [update, rate of the interval ending there] (warm-up included: the plot shows it);
    valid_curve rows are [update, loss, top1] (top1 in %, None for fairseq); the `end` record, the trainer's
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
