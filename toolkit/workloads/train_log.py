"""The trainer's log: JSON lines for reports, one readable line per record on stdout. Only rank 0 writes.

Records (`event` field), appended to LOG_NAME in --log-dir across restarts of the same run:
  start       one per attempt (every (re)start): world_size, backend, device, threads, arch, batch sizes,
              steps_per_epoch, total_steps, resumed_from_step (0 for a fresh run)
  train       one per log interval: step (updates done), epoch, loss (mean over the interval and all ranks),
              lr (of the interval's last step), images_per_sec, world_size, elapsed (s since this attempt's
              start), interval_steps, interval_images (all ranks), interval_seconds (training time only:
              checkpoint saves and validation are excluded)
  val         at each epoch end: epoch (the one just finished), step, top1, loss, images
  checkpoint  each save: step, epoch, position (batches done in `epoch`), reason, seconds
  end         last record of an attempt: status (completed | max_steps | stopped), step, epoch, elapsed,
              images_per_sec, steady_images_per_sec (see `steady_throughput`), top1 (last validation)
Every record also has `time` (Unix seconds). After a requeue without a stop signal, steps after the last
checkpoint are trained and logged again: for a loss curve keep the last record of each step.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

LOG_NAME = "train_log.jsonl"


class TrainLog:
    def __init__(self, log_dir: str | os.PathLike | None, enabled: bool) -> None:
        self.enabled = enabled
        self.records: list[dict[str, Any]] = []  # this attempt's, for the end summary
        self.path = Path(log_dir) / LOG_NAME if (enabled and log_dir) else None
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, event: str, **fields: Any) -> None:
        if not self.enabled:
            return
        record = {"event": event, **fields, "time": round(time.time(), 3)}
        self.records.append(record)
        if self.path:
            with open(self.path, "a") as handle:
                handle.write(json.dumps(record) + "\n")
        print(readable(record), flush=True)


def readable(record: dict[str, Any]) -> str:
    event = record["event"]
    if event == "train":
        return (f"step {record['step']} epoch {record['epoch']} loss {record['loss']:.4f} lr {record['lr']:.5g} "
                f"images/s {record['images_per_sec']:.1f} world_size {record['world_size']}")
    if event == "val":
        return f"val epoch {record['epoch']} step {record['step']} top1 {record['top1']:.2f}% loss {record['loss']:.4f}"
    shown = {k: v for k, v in record.items() if k not in ("event", "time")}
    return f"{event} " + " ".join(f"{k}={v}" for k, v in shown.items())


def read_log(path: str | os.PathLike) -> list[dict[str, Any]]:
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def steady_throughput(records: Iterable[dict[str, Any]]) -> float | None:
    """Images per second over `train` records, leaving out the first interval after each `start`
    (start-up, worker spin-up, allocator warm-up). None when no interval is left."""
    images = seconds = 0.0
    skip_next = False
    for record in records:
        if record["event"] == "start":
            skip_next = True
        elif record["event"] == "train":
            if skip_next:
                skip_next = False
                continue
            images += record["interval_images"]
            seconds += record["interval_seconds"]
    return images / seconds if seconds > 0 else None
