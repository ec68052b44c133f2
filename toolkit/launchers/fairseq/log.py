"""fairseq-train's training log, as the reports read it (the fairseq launcher's log_reader(); toolkit.reports.
training_logs asks every launcher for its reader).

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
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from toolkit.launchers.base import LogPoint, LogReader, json_object, number, whole_number

_TAGGED = re.compile(r"\|\s*[A-Z]+\s*\|\s*([\w.]+)\s*\|\s*(\{.*\})\s*$")
# --log-format simple (and fairseq <= 0.9): per-interval `epoch 001:    100 / 487 k=v, k=v` (commas) and
# end-of-epoch `epoch 001 | [valid on 'SUBSET' subset | ]k v | k v` (pipes).
_COMMAS = re.compile(r"(?:^|\| )epoch (\d+):\s+\d+ / \d+ (\w+=.*)$")
_PIPES = re.compile(r"(?:^|\| )epoch (\d+) \| (?:valid on '([\w.-]+)' subset \| )?(\w+ .*)$")
# fairseq's logging format: `%(asctime)s | %(levelname)s | %(name)s | %(message)s` (fairseq_cli/train.py), the
# time in the node's local time, whole seconds. fairseq.checkpoint_utils' lines (0.12): "Saved checkpoint PATH (epoch
# E @ U updates, score S) (writing took T seconds)" and "Loaded checkpoint PATH (epoch E @ U updates)".
_STAMPED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:,\d+)? \| [A-Z]+ \| ([\w.]+) \| (.*)$")
_SAVED = re.compile(r"[Ss]aved checkpoint .*? \(epoch \d+ @ (\d+) updates.*\(writing took ([\d.]+) seconds\)")
_LOADED = re.compile(r"[Ll]oaded checkpoint .*? \(epoch \d+ @ (\d+) updates\)")
FAIRSEQ_FIX = ("fairseq wrote no per-interval records this report can read (--log-format none, or tqdm on a "
               "terminal): train with --log-format json (or simple) and a --log-interval")


def _point(obj: dict, tag: str | None) -> LogPoint | None:
    if tag is None:  # --log-file: no tag; the key prefixes say the kind
        tag = "valid" if any(k.startswith("valid_") for k in obj) else "train" if "train_loss" in obj else "train_inner"
    prefix = "" if tag == "train_inner" else f"{tag}_"
    values = {k[len(prefix):] if prefix and k.startswith(prefix) else k: v for k, v in obj.items()}
    if "loss" not in values and "wps" not in values:
        return None
    return LogPoint(kind=tag, update=whole_number(values.get("num_updates")), epoch=number(values.get("epoch")),
                    loss=number(values.get("loss")), rate=number(values.get("wps")), wall=number(values.get("wall")),
                    values=values)


def _text_point(line: str) -> LogPoint | None:
    """A record of fairseq's simple / legacy text formats (see the module docstring), or None."""
    if m := _COMMAS.search(line):
        epoch, items, sep, tag = m.group(1), m.group(2).split(", "), "=", "train_inner"
    elif m := _PIPES.search(line):
        epoch, items, sep, tag = m.group(1), m.group(3).split(" | "), " ", m.group(2) or "train"
    else:
        return None
    pairs = (item.split(sep, 1) for item in items if sep in item)
    return _point({"epoch": int(epoch), **{k.strip(): v.strip() for k, v in pairs}}, tag)


def _wall_span(a: LogPoint | None, b: LogPoint) -> float | None:
    return b.wall - a.wall if a is not None and a.wall is not None and b.wall is not None else None


def _ups_span(a: LogPoint | None, b: LogPoint) -> float | None:
    """An interval's training seconds from its updates per second (fairseq's `wall` is whole seconds)."""
    ups = number(b.values.get("ups"))
    if a is None or a.update is None or b.update is None or not ups:
        return None
    return (b.update - a.update) / ups


class FairseqLog(LogReader):
    name = "fairseq"
    unit = "words/s"
    loss_base = "2"
    step_kind = "train_inner"
    wanted = "fairseq (--log-format json or simple)"
    interval_flag = "--log-interval"
    fix = FAIRSEQ_FIX

    def points(self, text: str) -> list[LogPoint]:
        found: list[LogPoint] = []
        for line in text.splitlines():
            tagged = _TAGGED.search(line)
            if tagged:
                obj = json_object(tagged.group(2))
                if obj is not None and (point := _point(obj, tagged.group(1))):
                    found.append(point)
                continue
            stripped = line.strip()
            obj = json_object(stripped) if stripped.startswith("{") else None
            if obj is None:
                if "epoch" in line and (point := _text_point(stripped)):
                    found.append(point)
            elif "event" not in obj and (point := _point(obj, None)):  # an `event` is no fairseq record's key
                found.append(point)
        return found

    def timed_records(self, text: str) -> list[dict[str, Any]]:
        """Each start (`training on N devices`), loaded checkpoint, train_inner record and checkpoint save with its
        line's time: the node's local time, read as this machine's (a cluster's nodes and login node share one)."""
        found: list[dict[str, Any]] = []
        for line in text.splitlines():
            stamped = _STAMPED.match(line.strip())
            if stamped is None:
                continue
            when = dt.datetime.strptime(stamped.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
            name, message = stamped.group(2), stamped.group(3)
            if name == "fairseq_cli.train" and message.startswith("training on "):
                found.append({"event": "start", "time": when})
            elif (loaded := _LOADED.search(message)) is not None:
                found.append({"event": "resumed", "time": when, "step": int(loaded.group(1))})
            elif (saved := _SAVED.search(message)) is not None:
                found.append({"event": "checkpoint", "time": when, "step": int(saved.group(1)),
                              "seconds": float(saved.group(2))})
            elif name == "train_inner":
                obj = json_object(message.strip())
                point = _point(obj, name) if obj is not None else _text_point(message.strip())
                if point is not None and point.update is not None:
                    found.append({"event": "train", "time": when, "step": point.update})
        return found

    def recognises(self, text: str) -> bool:
        """fairseq's own logger names (fairseq_cli.train, fairseq.trainer) appear in every format's stdout."""
        return "fairseq_cli." in text or "| fairseq." in text

    def throughput(self, points: list[LogPoint], warmup: int) -> tuple[float | None, str]:
        steps = [(p, p.rate) for p in points if p.kind == self.step_kind and p.rate is not None]
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


READER = FairseqLog()
