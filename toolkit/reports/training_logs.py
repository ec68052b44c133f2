"""Training logs -> throughput, loss curve, updates: fairseq's JSON log lines and our ResNet trainer's JSON lines.

fairseq (`--log-format json`): `<time> | INFO | train_inner | {json}` on stdout (`--log-file` writes the bare
JSON). Every value is a string except epoch; loss is base 2; wps of the first logged interval is "0" (start-up);
wpb and wps are summed over ranks and only rank 0 logs. Kinds: train_inner (plain keys), train (keys prefixed
`train_`, end of epoch), valid (prefixed `valid_`).

Throughput excludes warm-up: the first `warmup` logged intervals of the per-step kind are dropped (they hold
process start-up, data loading and the first, slow iterations; fairseq even logs wps "0" there), and the rest
are averaged weighted by the wall time of each interval (from the `wall` / `elapsed` clock), so the figure is
work done / time spent after warm-up.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from toolkit.errors import HpcError

_FAIRSEQ_TAGGED = re.compile(r"\|\s*[A-Z]+\s*\|\s*([\w.]+)\s*\|\s*(\{.*\})\s*$")

# Our ResNet trainer's JSON-lines keys: the one place to adjust if the trainer renames them.
RESNET_KEYS = {"update": "step", "epoch": "epoch", "loss": "loss", "rate": "images_per_sec", "wall": "elapsed",
               "lr": "lr", "world_size": "world_size"}
RESNET_SUMMARY = ("kind", "summary")  # key, value marking the trainer's final summary object


@dataclasses.dataclass
class LogPoint:
    kind: str  # fairseq: train_inner / train / valid (or another subset); resnet: train
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
    step_kind: str  # the per-interval kind throughput is computed from
    points: list[LogPoint]
    summary: dict | None = None  # the trainer's own final summary, if it wrote one
    source: str = ""


def _num(value) -> float | None:
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


def _resnet_point(obj: dict) -> LogPoint:
    k = RESNET_KEYS
    return LogPoint(kind=str(obj.get("kind", "train")), update=_int(obj.get(k["update"])), epoch=_num(obj.get(k["epoch"])),
                    loss=_num(obj.get(k["loss"])), rate=_num(obj.get(k["rate"])), wall=_num(obj.get(k["wall"])),
                    values=obj)


def _json_object(text: str) -> dict | None:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def parse_training_text(text: str, source: str = "") -> TrainingLog | None:
    """The training records in a log (fairseq or our trainer), or None if it holds none."""
    fairseq: list[LogPoint] = []
    resnet: list[LogPoint] = []
    summary = None
    for line in text.splitlines():
        tagged = _FAIRSEQ_TAGGED.search(line)
        if tagged:
            obj = _json_object(tagged.group(2))
            if obj is not None and (point := _fairseq_point(obj, tagged.group(1))):
                fairseq.append(point)
            continue
        stripped = line.strip()
        if not stripped.startswith("{"):
            continue
        obj = _json_object(stripped)
        if obj is None:
            continue
        if obj.get(RESNET_SUMMARY[0]) == RESNET_SUMMARY[1]:
            summary = obj
        elif RESNET_KEYS["rate"] in obj or RESNET_KEYS["update"] in obj:
            resnet.append(_resnet_point(obj))
        elif point := _fairseq_point(obj, None):
            fairseq.append(point)
    if fairseq:
        return TrainingLog("fairseq", "words/s", "2", "train_inner", fairseq, source=source)
    if resnet or summary:
        return TrainingLog("resnet", "images/s", "e", "train", resnet, summary=summary, source=source)
    return None


def parse_training_file(path: str | Path) -> TrainingLog:
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        raise HpcError(f"no such file: {path}", fix="check the path of the training log") from None
    log = parse_training_text(text, str(path))
    if log is None:
        raise HpcError(f"no training records in {path}",
                       fix="pass rank 0's log of fairseq (--log-format json) or of the toolkit's ResNet trainer")
    return log


def throughput(log: TrainingLog, warmup: int = 1) -> tuple[float | None, str]:
    """Post-warm-up throughput (see the module docstring) and a sentence saying how it was computed."""
    steps = [p for p in log.points if p.kind == log.step_kind and p.rate is not None]
    if not steps:
        return None, "no per-interval rates in the log"
    intervals = list(zip([None, *steps[:-1]], steps))  # (previous record, record)
    kept, note = intervals[warmup:], f"first {warmup} logged interval(s) excluded as warm-up"
    if not kept:
        kept, note = intervals, "too few log records to exclude warm-up: all intervals used"
    kept = [(a, b) for a, b in kept if b.rate > 0] or kept
    spans = [b.wall - a.wall if a is not None and a.wall is not None and b.wall is not None else 0.0 for a, b in kept]
    if all(span > 0 for span in spans):
        return sum(b.rate * span for (_, b), span in zip(kept, spans)) / sum(spans), note + "; weighted by interval wall time"
    return sum(b.rate for _, b in kept) / len(kept), note + "; plain mean of the interval rates"


def summarize_training(log: TrainingLog, warmup: int = 1) -> dict:
    rate, note = throughput(log, warmup)
    train = [p for p in log.points if p.kind == log.step_kind]
    valid = [p for p in log.points if p.kind not in (log.step_kind, "train")]
    updates = max((p.update for p in log.points if p.update is not None), default=None)
    if log.summary and updates is None:
        updates = _int(log.summary.get(RESNET_KEYS["update"]))
    return {
        "format": log.format, "source": log.source, "unit": log.unit, "throughput": rate, "throughput_note": note,
        "updates": updates,
        "epochs": max((p.epoch for p in log.points if p.epoch is not None), default=None),
        "final_loss": next((p.loss for p in reversed(train) if p.loss is not None), None),
        "loss_base": log.loss_base,
        "loss_curve": [[p.update, p.loss] for p in train if p.loss is not None],
        "valid_curve": [[p.update, p.loss] for p in valid if p.loss is not None],
        "trainer_summary": log.summary,
    }
