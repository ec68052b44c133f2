"""One run's summary from its run dir, and scaling efficiency across runs of one recipe at different sizes.

The run-dir contract (what `hpc recipes submit` writes; toolkit.submit.rundir). Reports read run dirs and
logs only, never live Slurm:

    RUN_DIR/metadata.json   a JSON object; read here:
        recipe          (str)  the recipe name; runs compared for scaling must share it (and the profile)
        profile         (str, optional) the recipe profile (e.g. smoke)
        nodes           (int)  nodes the job ran on
        ranks           (int)  processes (one per GPU, or CPU processes on CPU queues); if absent,
                               nodes x ranks_per_node, else the world_size our trainer logged
        ranks_per_node  (int, optional)
        gpus            (int, optional) GPUs in the job
        instance_type   (str, optional) the queue's instance type, for the nccl verdict of a collectives run
        fabric          (str, optional) the queue's EFA stack (modern | legacy | none): on an EFA one, a run
                               whose NCCL used sockets is flagged
        queue, job_ids, executor, ... (shown as they are)
    RUN_DIR/result.json     rank 0's exit record (optional: a killed job leaves none)
    RUN_DIR/logs/train_log.jsonl
                            our ResNet trainer's log, when the recipe keeps its logs dir under the run
                            (`dirs.logs: {under: run}`, as the smoke profile does)
    RUN_DIR/submitit/<job id>_<rank>_log.out|err
                            each rank's stdout / stderr; fairseq (and the collectives benchmark) log on
                            rank 0's stdout
    RUN_DIR/*.out           the output of a job sent with the rendered script (`#SBATCH --output`)

The training log used is the first of: logs/train_log.jsonl, rank 0's submitit logs (newest job first), then
every other *.out, *.err, *.log, *.jsonl, *.txt and *.json below RUN_DIR, that holds training records (only rank 0
logs them: fairseq and our trainer alike). A run dir without training records but with nccl-tests tables
(the collectives recipe) is summarised as nccl results. Every log is also searched for the network transport
NCCL selected (toolkit.reports.transport). A plain log file (no run dir) is summarised the same way, without
the metadata.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from toolkit.errors import HpcError
from toolkit.reports import nccl, training_logs, transport
from toolkit.reports.gaudi import verdict_for
from toolkit.submit.rundir import METADATA, RESULT, read_json
from toolkit.workloads.train_log import LOG_NAME

TRAINER_LOG = f"logs/{LOG_NAME}"
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
    profile: str | None = None
    job_ids: list[str] = dataclasses.field(default_factory=list)
    result: dict | None = None  # rank 0's result.json
    transport: dict | None = None  # NCCL's network: name (efa/tcp/ib or None), label, evidence, hosts
    efa_problem: str | None = None  # set when the queue has EFA but NCCL used something else (with the fix)
    log_only: bool = False  # summarised from a plain log file, not a run dir

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


def _job_number(path: Path) -> int:
    head = path.name.split("_", 1)[0]
    return int(head) if head.isdigit() else -1


def log_files(run_dir: Path) -> list[Path]:
    """The run's logs, most likely training log first (see the module docstring)."""
    rank0 = sorted((run_dir / "submitit").glob("*_0_log.*"), key=lambda p: (-_job_number(p), p.suffix != ".out"))
    preferred = [p for p in [run_dir / TRAINER_LOG, *rank0] if p.is_file()]
    rest = sorted({p for pattern in LOG_PATTERNS for p in run_dir.rglob(pattern)
                   if p.is_file() and p.name not in (METADATA, RESULT)} - set(preferred))
    return preferred + rest


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError as exc:
        raise HpcError(f"cannot read log {path}: {exc.strerror}", fix="check the run dir's permissions") from None


def _logged_world_size(log: training_logs.TrainingLog) -> int | None:
    sizes = [r.get("world_size") for r in reversed(log.records) if r["event"] in ("start", "train")]
    return next((w for w in sizes if isinstance(w, int) and not isinstance(w, bool) and w > 0), None)


def read_run(run_dir: str | Path) -> RunSummary:
    """Summarise one run dir (see the module docstring for what it must hold), or one plain log file."""
    run_dir = Path(run_dir)
    if run_dir.is_file():
        summary = RunSummary(str(run_dir), None, None, None, None, None, log_only=True)
        return _summarize_logs(summary, {run_dir: _read(run_dir)}, {},
                               f"no training records or nccl-tests results in {run_dir}", "pass rank 0's log of fairseq or the ResNet trainer's train_log.jsonl, an nccl-tests "
                               "log, or the run dir")
    meta = read_metadata(run_dir)
    nodes, gpus = _int_field(meta, "nodes", run_dir), _int_field(meta, "gpus", run_dir)
    ranks = _int_field(meta, "ranks", run_dir)
    per_node = _int_field(meta, "ranks_per_node", run_dir)
    if ranks is None and nodes and per_node:
        ranks = nodes * per_node
    result = read_json(run_dir / RESULT)
    summary = RunSummary(str(run_dir), meta.get("recipe"), nodes, ranks, gpus, None, profile=meta.get("profile"),
                         job_ids=[str(j) for j in meta.get("job_ids") or []],
                         result=result if isinstance(result, dict) else None)
    texts = {path: _read(path) for path in log_files(run_dir)}
    return _summarize_logs(summary, texts, meta, f"no training records or nccl-tests results in the logs of {run_dir}",
                           "check that the job ran (hpc jobs logs); our trainer's train_log.jsonl is read only from "
                           f"RUN_DIR/{TRAINER_LOG} (recipe dirs.logs under: run)")


def _summarize_logs(summary: RunSummary, texts: dict[Path, str], meta: dict, missing: str, fix: str) -> RunSummary:
    """Fill the summary from the first log with training records, else the first with nccl-tests tables; and
    NCCL's transport over all of them, flagged against the queue's EFA setting."""
    found = transport.logs_transport({str(p): t for p, t in texts.items()})
    summary.transport = {"name": found.name, "label": found.label, "evidence": found.evidence, "hosts": found.hosts,
                         "source": found.source}
    efa = transport.efa_expected(meta)
    summary.efa_problem = transport.efa_problem(found, efa)
    for path, text in texts.items():
        log = training_logs.parse_training_text(text, str(path))
        if log:
            summary.log, summary.training = log.source, training_logs.summarize_training(log)
            if summary.ranks is None:
                summary.ranks = _logged_world_size(log)
            return summary
    for path, text in texts.items():
        tests = nccl.parse_text(text, str(path))
        if tests:
            summary.log = str(path)
            instance_type = meta.get("instance_type")
            # judged over the queue's transport, not the instance type's
            expected = None if efa is None else transport.EFA if efa else transport.TCP
            summary.nccl = [{**nccl.summarize(t), "verdict": dataclasses.asdict(
                verdict_for(t, instance_type, summary.nodes, expected))} for t in tests]
            return summary
    if any(training_logs.looks_like_fairseq(text) for text in texts.values()):
        fix = training_logs.FAIRSEQ_FIX
    raise HpcError(missing, fix=fix)


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
    if len({r.unit for r in runs}) > 1 or len({(r.recipe, r.profile) for r in runs if r.recipe}) > 1:
        kinds = sorted({f"{r.recipe}{f' --profile {r.profile}' if r.profile else ''} ({r.unit})" for r in runs})
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
