"""Calibration runs, read back: what one run measured (throughput, its spread, the step's phases, the batch), the
bus bandwidth a collectives run measured, and the calibration record `hpc plan calibrate` writes.

Run dirs are read the way the reports read them (toolkit.reports.scaling.read_run: the training log's steady
throughput and logged intervals; the ranks' heartbeats: median seconds per step and per phase, data / compute
(our trainer's forward pass) / sync (backward, the all-reduce and the optimizer); toolkit.reports.nccl: the
collectives run's nccl-tests tables). The record is one JSON file per recipe and queue under the runs root,
<runs root>/calibrations/<recipe>--<queue>.json, naming the run dirs; `hpc plan RECIPE --queue Q` reads it when
no --from is given.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any

from toolkit.errors import HpcError, UsageError
from toolkit.planner.model import relative_spread
from toolkit.rundir import RunDir, read_json, runs_root, write_json

CALIBRATIONS = "calibrations"
# torch.nn.parallel.DistributedDataParallel's default bucket_cap_mb=25: gradients are all-reduced in messages of
# about this size, so the bus bandwidth that matters is the one at this size (busbw rises with the message size).
DDP_BUCKET_BYTES = 25 * 2**20


@dataclasses.dataclass(frozen=True)
class Measured:
    """One calibration training run."""

    run_dir: str
    recipe: str | None
    profile: str | None
    queue: str | None
    instance_type: str | None
    nodes: int
    ranks_per_node: int
    unit: str
    throughput: float  # samples/s over the job, the reports' steady rule
    spread: float  # relative spread of the logged intervals' rates
    step_s: float  # global batch / throughput
    data_s: float  # of step_s, the ranks' median wait for input (heartbeats), scaled to step_s
    forward_s: float | None  # of step_s, the median forward pass
    samples_per_rank_step: float
    samples_per_epoch: float | None  # steps per epoch x global batch (our trainer's start record)
    parameters: int | None  # the model's parameter count, where the trainer logged it

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Collectives:
    """A collectives (nccl-tests format) run's all-reduce bus bandwidth at the size the gradients travel in."""

    run_dir: str
    nodes: int | None
    busbw_gbs: float
    size: int  # the message size it was read at

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _start_record(records: list[dict]) -> dict:
    return next((r for r in reversed(records) if r.get("event") == "start"), {})


def read_training(run_dir: str | Path) -> Measured:
    """One calibration run's measurements (the CLI names the run dir in every error)."""
    from toolkit.reports import training_logs
    from toolkit.reports.scaling import read_run

    summary = read_run(run_dir)
    run = RunDir(Path(run_dir))
    meta = run.read_metadata()
    if not summary.training or not summary.throughput:
        raise UsageError(f"{run_dir} is not a training run with a throughput (a calibration run is one)",
                         fix="pass the run dirs `hpc plan calibrate` made (or training runs of the recipe)")
    nodes = meta.nodes or summary.nodes
    if not nodes:
        raise HpcError(f"{run_dir}: its node count is unknown", fix="add nodes to its metadata.json")
    ranks = summary.ranks or nodes
    texts = run.log_texts()
    log = next((parsed for path, text in texts.items()
                if (parsed := training_logs.parse_training_text(text, str(path))) is not None), None)
    start = _start_record(log.records) if log else {}
    batch = start.get("batch_size")
    if not isinstance(batch, (int, float)) or batch <= 0:
        raise UsageError(f"{run_dir}: its log does not say the per-rank batch (our trainer's start record does)",
                         fix="calibrate with `hpc plan calibrate`, or give the batch: --set samples_per_rank_step=N")
    accumulation = start.get("accumulation") or 1
    per_rank = float(batch) * float(accumulation)
    global_batch = per_rank * ranks
    step_s = global_batch / summary.throughput
    beats = [b for b in run.heartbeats() if b.timed_steps and "step" in b.medians]
    data_s, forward_s = 0.0, None
    if beats:
        step_median = statistics.median(b.medians["step"] for b in beats)
        if step_median > 0:
            if all("data" in b.medians for b in beats):
                data_s = step_s * statistics.median(b.medians["data"] for b in beats) / step_median
            if all("compute" in b.medians for b in beats):
                forward_s = step_s * statistics.median(b.medians["compute"] for b in beats) / step_median
    rates = [r for _, r in summary.training["rate_curve"][1:]]  # the first interval is warm-up
    steps_per_epoch = start.get("steps_per_epoch")
    gbs = start.get("global_batch_size")
    epoch = float(steps_per_epoch) * float(gbs) if isinstance(steps_per_epoch, int) and isinstance(
        gbs, (int, float)) else None
    parameters = start.get("parameters")
    return Measured(str(run_dir), meta.recipe, meta.profile, meta.queue, meta.instance_type, nodes, ranks // nodes,
                    summary.training["unit"], summary.throughput, relative_spread(rates), step_s, data_s, forward_s,
                    per_rank, epoch, parameters if isinstance(parameters, int) else None)


def read_collectives(run_dir: str | Path) -> Collectives:
    """The all-reduce bus bandwidth of a collectives run, at the DDP bucket size (or its largest size below)."""
    from toolkit.reports import nccl

    run = RunDir(Path(run_dir))
    meta = run.read_metadata()
    tests = [t for path, text in run.log_texts().items() for t in nccl.parse_text(text, str(path))]
    allreduce = [t for t in tests if (t.name or "all_reduce") == "all_reduce" and t.rows]
    if not allreduce:
        raise UsageError(f"{run_dir} holds no all_reduce bus bandwidth table",
                         fix="pass a collectives run (hpc recipes submit collectives ...) or nccl-tests' all_reduce")
    rows = [r for r in allreduce[0].rows if r.measures()]
    under = [r for r in rows if r.size <= DDP_BUCKET_BYTES]
    row = max(under, key=lambda r: r.size) if under else min(rows, key=lambda r: r.size)
    busbw = max(m.busbw_gbs for m in row.measures())
    return Collectives(str(run_dir), meta.nodes, busbw, row.size)


def is_collectives(run_dir: str | Path) -> bool:
    meta = RunDir(Path(run_dir)).metadata()
    return meta is not None and meta.recipe in ("collectives", "nccl-tests")


# The record -------------------------------------------------------------------------------------------------------

def record_path(recipe: str, queue: str, root: Path | None = None) -> Path:
    return (root or runs_root()) / CALIBRATIONS / f"{recipe}--{queue}.json"


def write_record(recipe: str, queue: str, training: list[str], collectives: list[str], profile: str | None,
                 root: Path | None = None) -> Path:
    path = record_path(recipe, queue, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"recipe": recipe, "queue": queue, "profile": profile, "training": training,
                      "collectives": collectives, "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    return path


def read_record(recipe: str, queue: str, root: Path | None = None) -> dict | None:
    path = record_path(recipe, queue, root)
    data = read_json(path) if path.exists() else None
    if data is not None and not isinstance(data.get("training"), list):
        raise HpcError(f"{path} is not a calibration record", fix=f"run `hpc plan calibrate {recipe} --queue "
                                                                  f"{queue}` again")
    return data


def record_json(path: Path) -> str:
    return json.dumps(read_json(path), indent=2)
