"""Figures for the reports: built as matplotlib Figures (tests inspect them), saved as PNG with the Agg backend.

matplotlib is imported inside the functions: it is heavy and only the plotting commands need it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.errors import HpcError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from toolkit.reports.nccl import NcclTest
    from toolkit.reports.scaling import ScalingRow


def _figure():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise HpcError("plots need matplotlib", fix="pip install 'hpc-toolkit[reports]' (or matplotlib)") from None
    fig = Figure(figsize=(8, 5), layout="constrained")  # no pyplot: no global state, no GUI backend
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
    ax = fig.add_subplot()
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
