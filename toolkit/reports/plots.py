"""Figures for the reports: built as matplotlib Figures (tests inspect them), saved as PNG with the Agg backend.

matplotlib is imported inside the functions: it is heavy and only the plotting commands need it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from toolkit.errors import HpcError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from toolkit.reports.goodput import Ledger
    from toolkit.reports.nccl import NcclTest
    from toolkit.reports.scaling import ScalingRow


def _figure(height: float = 5):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise HpcError("plots need matplotlib", fix="pip install 'hpc-toolkit[reports]' (or matplotlib)") from None
    fig = Figure(figsize=(8, height), layout="constrained")  # no pyplot: no global state, no GUI backend
    FigureCanvasAgg(fig)
    return fig


def nccl_figure(tests: list[NcclTest], floor_gbs: float | None = None) -> Figure:
    """Bus bandwidth against message size, out-of-place and in-place per test, with the floor if one applies."""
    fig = _figure()
    ax = fig.add_subplot()
    for test in tests:
        label = test.name or "nccl test"
        for placement, style in (("out_of_place", "-o"), ("in_place", "--s")):
            points = [(r.size, getattr(r, placement).busbw_gbs) for r in test.rows if getattr(r, placement)]
            if points:
                ax.plot(*zip(*points, strict=True), style, markersize=3, label=f"{label} {placement.replace('_', '-')}")
    if floor_gbs is not None:
        ax.axhline(floor_gbs, color="red", linestyle=":", label=f"floor {floor_gbs:g} GB/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("nccl-tests bus bandwidth")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return fig


def scaling_figure(rows: list[ScalingRow], unit: str, title: str = "") -> Figure:
    """Measured throughput against ranks beside ideal linear scaling from the smallest run."""
    fig = _figure()
    ax = fig.add_subplot()
    ranks = [r.ranks for r in rows]
    ax.plot(ranks, [r.throughput for r in rows], "-o", label="measured")
    ax.plot(ranks, [r.ideal_throughput for r in rows], "--", color="gray", label="ideal (linear)")
    for r in rows:
        ax.annotate(f"{r.efficiency:.0%}", (r.ranks, r.throughput), textcoords="offset points", xytext=(4, -12))
    ax.set_xlabel("ranks (GPUs or CPU processes)")
    ax.set_ylabel(f"throughput ({unit})")
    ax.set_title(title or "scaling")
    ax.set_xticks(ranks)
    ax.set_ylim(bottom=0)  # from zero: a flat measured line must look flat beside the ideal one
    ax.margins(x=0.1)  # room for the efficiency labels of the first and last points
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def stragglers_figure(ranks: list[dict], baseline_own_ms: float, threshold: float, title: str = "") -> Figure:
    """Each rank's median step split into its phases (stacked bars), the baseline own work (data + compute: the
    ranks' lower quartile) and the straggler line above it; flagged ranks' bars outlined in red."""
    fig = _figure()
    _stragglers_axes(fig.add_subplot(), ranks, baseline_own_ms, threshold, title)
    return fig


def _stragglers_axes(ax, ranks: list[dict], baseline_own_ms: float, threshold: float, title: str = "") -> None:
    phases = [p for p in ("data", "compute", "sync") if any(p in r["phases_ms"] for r in ranks)]
    labels = [f"{r['rank']}\n{r['node']}" for r in ranks]
    bottom = [0.0] * len(ranks)
    for phase in phases:
        heights = [r["phases_ms"].get(phase, 0.0) for r in ranks]
        ax.bar(labels, heights, bottom=bottom, label=phase)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    for i, r in enumerate(ranks):
        if r["slow"]:
            ax.bar(labels[i], bottom[i], fill=False, edgecolor="red", linewidth=2)
    ax.axhline(baseline_own_ms, color="gray", linestyle="--", label="baseline own work (data + compute)")
    ax.axhline(baseline_own_ms * (1 + threshold), color="red", linestyle=":",
               label=f"straggler line (+{threshold:.0%})")
    ax.set_xlabel("rank / node")
    ax.set_ylabel("median ms per step")
    ax.set_title(title or "per-rank step time")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()


def training_figure(training: dict, stragglers: dict | None = None, title: str = "") -> Figure:
    """A run's training over its steps: loss (train, and validation where logged) and each logged interval's
    throughput with the post-warm-up mean; below them each rank's step time (stragglers_figure) when the run
    has the ranks' heartbeats. `training` is training_logs.summarize_training()'s dict."""
    loss, valid, rates = training["loss_curve"], training["valid_curve"], training.get("rate_curve") or []
    if not loss and not rates:
        from toolkit.reports.training_logs import interval_flags

        raise HpcError(f"{training['source'] or 'the log'}: no loss or throughput per step to plot",
                       fix=f"log training intervals ({interval_flags()}; our trainer logs them itself)")
    ranks = stragglers["ranks"] if stragglers else []
    fig = _figure(9 if ranks else 6)
    axes = fig.subplots(3 if ranks else 2, 1)
    ax = axes[0]
    if loss:
        ax.plot(*zip(*loss, strict=True), "-", marker="." if len(loss) < 50 else None, label="train")
    if valid:
        ax.plot([v[0] for v in valid], [v[1] for v in valid], "s--", markersize=4, label="validation")
    ax.set_xlabel("update (step)")
    ax.set_ylabel(f"loss (base {training['loss_base']})")
    ax.set_title(title or "training")
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax = axes[1]
    if rates:
        ax.plot(*zip(*rates, strict=True), "-", marker="." if len(rates) < 50 else None, color="tab:green",
                label="per logged interval")
    if training["throughput"] is not None:
        ax.axhline(training["throughput"], color="gray", linestyle="--",
                   label=f"after warm-up: {training['throughput']:.1f}")
    ax.set_xlabel("update (step)")
    ax.set_ylabel(f"throughput ({training['unit']})")
    ax.set_ylim(bottom=0)  # from zero: warm-up dips and a steady rate read at their true size
    ax.grid(True, alpha=0.3)
    ax.legend()
    if ranks and stragglers:
        _stragglers_axes(axes[2], ranks, stragglers["baseline_own_ms"], stragglers["threshold"])
    return fig


def nodes_figure(rows: list[dict], title: str = "") -> Figure:
    """Each node's all_reduce bus bandwidth in the last group it ran in (toolkit.health.nodesearch.node_rows); bad
    nodes red, unresolved orange, failed runs as an empty red bar at the axis."""
    fig = _figure()
    ax = fig.add_subplot()
    colors = {"bad": "tab:red", "unresolved": "tab:orange"}
    names = [r["node"] for r in rows]
    heights = [r["busbw"] or 0.0 for r in rows]
    ax.bar(names, heights, color=[colors.get(r["verdict"], "tab:blue") for r in rows])
    for i, r in enumerate(rows):
        if r["busbw"] is None:
            ax.annotate("failed", (i, 0), ha="center", va="bottom", color="tab:red", fontsize=8, rotation=90)
    ax.set_xlabel("node")
    ax.set_ylabel("all_reduce bus bandwidth (GB/s)")
    ax.set_title(title or "per-node bus bandwidth (hpc cluster find-bad-nodes)")
    ax.tick_params(axis="x", labelrotation=90)
    ax.grid(True, axis="y", alpha=0.3)
    return fig


def goodput_figure(ledgers: list[Ledger], title: str = "") -> Figure:
    """One timeline per job, from its submission: each segment of the ledger (toolkit.reports.goodput) a bar of its
    kind's colour; the legend names the kinds present with their share of all the jobs' time."""
    from toolkit.reports.goodput import KINDS

    fig = _figure(1.8 + 0.6 * max(len(ledgers), 1))
    ax = fig.add_subplot()
    seen: dict[str, float] = {}
    for row, led in enumerate(ledgers):
        base = led.start or 0.0
        for s in led.segments:
            ax.barh(row, s.seconds, left=s.start - base, color=KINDS[s.kind][1], edgecolor="white", linewidth=0.3)
            seen[s.kind] = seen.get(s.kind, 0.0) + s.seconds
    wall = sum(seen.values()) or 1.0
    from matplotlib.patches import Patch

    handles = [Patch(color=KINDS[k][1], label=f"{k} {seen[k] / wall:.0%}") for k in KINDS if seen.get(k)]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 5), fontsize=8, frameon=False)
    ax.set_yticks(range(len(ledgers)))
    ax.set_yticklabels([_job_label(led) for led in ledgers], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since submission")
    ax.set_title(title or "where each job's time went (goodput)")
    ax.grid(True, axis="x", alpha=0.3)
    return fig


def _job_label(led: Ledger) -> str:
    good = f"{led.goodput:.0%}" if led.goodput is not None else "?"
    return f"{Path(led.run_dir).name[-28:]}\n{', '.join(led.job_ids) or '-'}: goodput {good}"


def plan_figure(rows: list[dict], title: str = "") -> Figure:
    """`hpc plan --plot`: time to the target and its cost against the node count (toolkit.planner.predict's rows),
    each with its uncertainty band; the cost axis is left out where the catalog has no price."""
    fig = _figure(6)
    time_ax, cost_ax = fig.subplots(2, 1, sharex=True)
    nodes = [r["nodes"] for r in rows]
    hours = [r["time_s"] / 3600 for r in rows]
    time_ax.plot(nodes, hours, "-o", label="predicted")
    time_ax.fill_between(nodes, [r["time_low_s"] / 3600 for r in rows], [r["time_high_s"] / 3600 for r in rows],
                         alpha=0.25, label="uncertainty band")
    for r, h in zip(rows, hours, strict=True):
        time_ax.annotate(f"{r['efficiency']:.0%}", (r["nodes"], h), textcoords="offset points", xytext=(4, 4))
    time_ax.set_ylabel("time to target (hours)")
    time_ax.set_title(title or "plan")
    time_ax.set_xscale("log", base=2)
    time_ax.set_ylim(bottom=0)
    time_ax.grid(True, which="both", alpha=0.3)
    time_ax.legend()
    if any(r["cost_usd"] is not None for r in rows):
        priced = [r for r in rows if r["cost_usd"] is not None]
        cost_ax.plot([r["nodes"] for r in priced], [r["cost_usd"] for r in priced], "-o", color="tab:red")
        cost_ax.fill_between([r["nodes"] for r in priced], [r["cost_low_usd"] for r in priced],
                             [r["cost_high_usd"] for r in priced], color="tab:red", alpha=0.2)
        cost_ax.set_ylabel("cost (USD)")
        cost_ax.set_ylim(bottom=0)
    else:
        cost_ax.text(0.5, 0.5, "no price for this instance type in the catalog", ha="center", va="center",
                     transform=cost_ax.transAxes)
        cost_ax.set_yticks([])
    cost_ax.set_xlabel("nodes (efficiency against linear scaling above the points)")
    cost_ax.set_xticks(nodes, [str(n) for n in nodes])
    cost_ax.grid(True, which="both", alpha=0.3)
    return fig


def save_png(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise HpcError(f"plot file {path} does not end in .png", fix="name the plot file *.png")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png", dpi=110)
    except OSError as exc:
        raise HpcError(f"cannot write {path}: {exc.strerror}", fix="choose a writable path for --plot") from None
    return path


def fleet_figure(records: list[dict], suspects: Sequence[str] = (), title: str = "") -> Figure:
    """Each node's ledger over time (toolkit.node.ledger records): passes as green dots, strikes as red crosses;
    suspected nodes' names in red."""
    import datetime

    fig = _figure()
    ax = fig.add_subplot()
    nodes = sorted({str(r["node"]) for r in records if r.get("type") == "node" and r.get("node")})
    row = {name: i for i, name in enumerate(nodes)}
    for verdict, marker, color, label in (("pass", "o", "tab:green", "pass"), ("fail", "x", "tab:red", "strike")):
        chosen = [r for r in records if r.get("type") == "node" and r.get("verdict") == verdict and r.get("node")]
        ax.scatter([datetime.datetime.fromtimestamp(float(r["time"])) for r in chosen],
                   [row[str(r["node"])] for r in chosen], marker=marker, color=color, label=f"{label} ({len(chosen)})")
    ax.set_yticks(range(len(nodes)))
    ax.set_yticklabels(nodes)
    for tick, name in zip(ax.get_yticklabels(), nodes, strict=True):
        if name in suspects:
            tick.set_color("tab:red")
    ax.set_xlabel("time")
    ax.set_ylabel("node")
    ax.set_title(title or "node ledger: passes and strikes (suspected nodes in red)")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.autofmt_xdate()
    return fig
