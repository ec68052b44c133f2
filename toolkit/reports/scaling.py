"""One run's summary from its run dir, and scaling efficiency across runs of one recipe at different sizes.

Reports read run dirs (toolkit.rundir.RunDir) and logs only, never live Slurm. From metadata.json: recipe and
profile (runs compared for scaling must share them), nodes, ranks (if absent, nodes x ranks_per_node, else the
world_size our trainer logged), gpus, instance_type (the nccl verdict of a collectives run) and fabric (on an
EFA queue, a run whose NCCL used sockets is flagged).

The training log used is the first of RunDir.log_files() (the trainer's train_log.jsonl, rank 0's logs, then
the run's other logs) that holds training records (only rank 0 logs them: the launchers' programs and our trainer
alike). A run dir without training records but with nccl-tests tables (the collectives recipe) is summarised as
nccl results. The network NCCL selected is transport.run_network() over the same logs. A plain log file (no run dir) is
summarised the same way, without the metadata.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from toolkit.errors import HpcError
from toolkit.reports import nccl, training_logs, transport
from toolkit.reports.stragglers import DEFAULT_THRESHOLD, find_stragglers
from toolkit.reports.transport import Network
from toolkit.rundir import METADATA, TRAINER_LOG, Metadata, RunDir


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
    stragglers: dict | None = None  # toolkit.reports.stragglers over the ranks' heartbeats, where the run has them

    @property
    def throughput(self) -> float | None:
        return self.training["throughput"] if self.training else None

    @property
    def unit(self) -> str | None:
        return self.training["unit"] if self.training else None


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError as exc:
        raise HpcError(f"cannot read log {path}: {exc.strerror}", fix="check the run dir's permissions") from None


def _logged_world_size(log: training_logs.TrainingLog) -> int | None:
    sizes = [r.get("world_size") for r in reversed(log.records) if r["event"] in ("start", "train")]
    return next((w for w in sizes if isinstance(w, int) and not isinstance(w, bool) and w > 0), None)


def read_run(run_dir: str | Path, straggler_threshold: float = DEFAULT_THRESHOLD) -> RunSummary:
    """Summarise one run dir (see the module docstring for what it must hold), or one plain log file; with the
    ranks' heartbeats, the straggling ranks above `straggler_threshold` (toolkit.reports.stragglers)."""
    run_dir = Path(run_dir)
    if run_dir.is_file():
        summary = RunSummary(str(run_dir), None, None, None, None, None, log_only=True)
        texts = {run_dir: _read(run_dir)}
        network = Network(transport.logs_transport({str(run_dir): texts[run_dir]}), None)
        return _summarize_logs(summary, texts, network, Metadata(),
                               f"no training records or nccl-tests results in {run_dir}",
                               f"pass rank 0's log of {training_logs.programs()} or the ResNet trainer's "
                               "train_log.jsonl, an nccl-tests log, or the run dir")
    run = RunDir(run_dir)
    meta = run.read_metadata()
    ranks = meta.ranks
    if ranks is None and meta.nodes and meta.ranks_per_node:
        ranks = meta.nodes * meta.ranks_per_node
    result = run.result()
    beats = run.heartbeats()
    summary = RunSummary(str(run_dir), meta.recipe, meta.nodes, ranks, meta.gpus, None, profile=meta.profile,
                         job_ids=meta.job_ids, result=result.to_json() if result else None,
                         stragglers=find_stragglers(beats, straggler_threshold).to_json() if beats else None)
    texts = run.log_texts()
    return _summarize_logs(summary, texts, transport.run_network(run, texts), meta,
                           f"no training records or nccl-tests results in the logs of {run_dir}",
                           "check that the job ran (hpc jobs logs); our trainer's train_log.jsonl is read only from "
                           f"RUN_DIR/{TRAINER_LOG} (recipe dirs.logs under: run)")


def _summarize_logs(summary: RunSummary, texts: dict[Path, str], network: Network, meta: Metadata, missing: str,
                    fix: str) -> RunSummary:
    """Fill the summary from the first log with training records, else the first with nccl-tests tables; and
    the network NCCL used, flagged against the queue's EFA setting."""
    found = network.transport
    summary.transport = {"name": found.name, "label": found.label, "evidence": found.evidence, "hosts": found.hosts,
                         "source": found.source}
    summary.efa_problem = network.problem
    efa = transport.efa_expected(meta.fabric)
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
            # judged over the queue's transport, not the instance type's
            expected = None if efa is None else transport.EFA if efa else transport.TCP
            summary.nccl = [{**nccl.summarize(t), "verdict": dataclasses.asdict(
                nccl.verdict_for(t, meta.instance_type, summary.nodes, expected))} for t in tests]
            return summary
    raise HpcError(missing, fix=training_logs.unreadable_fix(texts.values()) or fix)


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
    measured = []  # (run, its throughput, its ranks)
    for run in runs:
        if run.throughput is None:
            raise HpcError(f"{run.run_dir} has no training throughput", fix="pass run dirs of training recipes")
        if run.ranks is None:
            fix = (f"add ranks to its {METADATA}" if Path(run.run_dir).is_dir() else
                   f"pass the run dirs (their {METADATA} says how many ranks ran), not the logs")
            raise HpcError(f"{run.run_dir}: the number of ranks is unknown", fix=fix)
        measured.append((run, run.throughput, run.ranks))
    if len({r.unit for r in runs}) > 1 or len({(r.recipe, r.profile) for r in runs if r.recipe}) > 1:
        kinds = sorted({f"{r.recipe}{f' --profile {r.profile}' if r.profile else ''} ({r.unit})" for r in runs})
        raise HpcError(f"the runs are of different recipes: {', '.join(kinds)}", fix="compare runs of one recipe only")
    ordered = sorted(measured, key=lambda m: (m[2], m[0].run_dir))
    base, base_throughput, base_ranks = ordered[0]
    if base_throughput <= 0:
        raise HpcError(f"{base.run_dir} has zero throughput", fix="check that run's log: it made no progress")
    rows = []
    for run, throughput, ranks in ordered:
        ideal = base_throughput * ranks / base_ranks
        rows.append(ScalingRow(run.run_dir, run.nodes, ranks, throughput, throughput / base_throughput,
                               ideal, throughput / ideal))
    return rows
