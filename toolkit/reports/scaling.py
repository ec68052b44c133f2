"""One run's summary from its run dir, and scaling efficiency across runs of one recipe at different sizes.

The run-dir contract read here (reports read run dirs and logs only, never live Slurm):

    RUN_DIR/metadata.json   a JSON object with
        recipe   (str)  the recipe name; runs compared for scaling must share it
        nodes    (int)  nodes the job ran on
        ranks    (int)  processes (one per GPU, or CPU processes on CPU queues); if absent,
                        nodes x ntasks_per_node, else the trainer's logged world_size
        gpus     (int, optional) GPUs in the job
        instance_type (str, optional) the queue's instance type, for the nccl verdict of a collectives run
        logs     (list of str, optional) log files relative to RUN_DIR; default: every *.out, *.err, *.log,
                        *.jsonl, *.txt and *.json (but metadata.json) below RUN_DIR
    The log used is the one with the most training records (rank 0's: fairseq and our trainer log only there);
    a run dir without training records but with nccl-tests tables (e.g. the collectives recipe) is summarised
    as nccl results.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from toolkit.errors import HpcError
from toolkit.reports import nccl, training_logs

METADATA = "metadata.json"
LOG_PATTERNS = ("*.out", "*.err", "*.log", "*.jsonl", "*.txt", "*.json")


@dataclasses.dataclass
class RunSummary:
    run_dir: str
    recipe: str | None
    nodes: int | None
    ranks: int | None
    gpus: int | None
    log: str | None
    training: dict | None = None  # training_logs.summarize_training()
    nccl: list[dict] | None = None  # per test: nccl.summarize() plus its verdict

    @property
    def throughput(self) -> float | None:
        return self.training["throughput"] if self.training else None

    @property
    def unit(self) -> str | None:
        return self.training["unit"] if self.training else None


def read_metadata(run_dir: Path) -> dict:
    path = run_dir / METADATA
    if not run_dir.is_dir():
        raise HpcError(f"no such run dir: {run_dir}", fix="pass the run directory `hpc recipes submit` printed")
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise HpcError(f"{run_dir} has no {METADATA}", fix=f"pass a run dir made by the toolkit (it writes {METADATA})") from None
    except json.JSONDecodeError as exc:
        raise HpcError(f"{path} is not valid JSON: {exc}", fix="repair or regenerate the run's metadata") from None
    if not isinstance(data, dict):
        raise HpcError(f"{path} is not a JSON object", fix="repair or regenerate the run's metadata")
    return data


def _int_field(meta: dict, key: str, path: Path) -> int | None:
    value = meta.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise HpcError(f"{path}: {key} must be a positive integer, got {value!r}", fix=f"fix {key} in {METADATA}")
    return value


def log_files(run_dir: Path, meta: dict) -> list[Path]:
    if meta.get("logs"):
        return [run_dir / name for name in meta["logs"]]
    found = {p for pattern in LOG_PATTERNS for p in run_dir.rglob(pattern) if p.is_file() and p.name != METADATA}
    return sorted(found)


def read_run(run_dir: str | Path) -> RunSummary:
    """Summarise one run dir (see the module docstring for what it must hold)."""
    run_dir = Path(run_dir)
    meta = read_metadata(run_dir)
    nodes, gpus = _int_field(meta, "nodes", run_dir), _int_field(meta, "gpus", run_dir)
    ranks = _int_field(meta, "ranks", run_dir)
    per_node = _int_field(meta, "ntasks_per_node", run_dir)
    if ranks is None and nodes and per_node:
        ranks = nodes * per_node
    summary = RunSummary(str(run_dir), meta.get("recipe"), nodes, ranks, gpus, None)
    texts = {}
    for path in log_files(run_dir, meta):
        try:
            texts[path] = path.read_text(errors="replace")
        except OSError as exc:
            raise HpcError(f"cannot read log {path}: {exc.strerror}", fix=f"check the logs listed in {METADATA}") from None
    logs = [log for path, text in texts.items() if (log := training_logs.parse_training_text(text, str(path)))]
    if logs:
        best = max(logs, key=lambda log: len(log.points))
        summary.log, summary.training = best.source, training_logs.summarize_training(best)
        key = training_logs.RESNET_KEYS["world_size"]
        world = [r.get(key) for r in [best.summary or {}] + [p.values for p in reversed(best.points)]]
        if summary.ranks is None:
            summary.ranks = next((w for w in world if isinstance(w, int) and w > 0), None)
        return summary
    for path, text in texts.items():
        tests = nccl.parse_text(text, str(path)) if not text.lstrip().startswith("{") else []
        if tests:
            summary.log = str(path)
            instance_type = meta.get("instance_type")
            summary.nccl = [{**nccl.summarize(t), "verdict": dataclasses.asdict(nccl.judge(t, instance_type, nodes))}
                            for t in tests]
            return summary
    raise HpcError(f"no training records or nccl-tests results in the logs of {run_dir}",
                   fix="check that the job ran (hpc jobs logs) and that rank 0's log is in the run dir")


@dataclasses.dataclass
class ScalingRow:
    run_dir: str
    nodes: int | None
    ranks: int
    throughput: float
    speedup: float  # throughput / the smallest run's
    ideal_throughput: float  # the smallest run's throughput x ranks / its ranks
    efficiency: float  # throughput / ideal_throughput


def scaling(runs: list[RunSummary]) -> list[ScalingRow]:
    """Speed-up and scaling efficiency of each run against the run with the fewest ranks."""
    if not runs:
        raise HpcError("no runs given", fix="pass two or more run dirs of one recipe")
    for run in runs:
        if run.throughput is None:
            raise HpcError(f"{run.run_dir} has no training throughput", fix="pass run dirs of training recipes")
        if run.ranks is None:
            raise HpcError(f"{run.run_dir}: the number of ranks is unknown", fix=f"add ranks to its {METADATA}")
    if len({r.unit for r in runs}) > 1 or len({r.recipe for r in runs if r.recipe}) > 1:
        kinds = sorted({f"{r.recipe} ({r.unit})" for r in runs})
        raise HpcError(f"the runs are of different recipes: {', '.join(kinds)}", fix="compare runs of one recipe only")
    ordered = sorted(runs, key=lambda r: (r.ranks, r.run_dir))
    base = ordered[0]
    if base.throughput <= 0:
        raise HpcError(f"{base.run_dir} has zero throughput", fix="check that run's log: it made no progress")
    rows = []
    for run in ordered:
        ideal = base.throughput * run.ranks / base.ranks
        rows.append(ScalingRow(run.run_dir, run.nodes, run.ranks, run.throughput, run.throughput / base.throughput,
                               ideal, run.throughput / ideal))
    return rows
