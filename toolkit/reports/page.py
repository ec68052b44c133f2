"""A run page: one self-contained HTML file per run, and an index across runs (`hpc report html`).

Self-contained: no script, no stylesheet or font from elsewhere, every figure a PNG inside the page (a data: URI),
so a page opened from a laptop's disk after copying the run dir, or served by `python -m http.server` on a login
node, asks no network for anything. Links between pages and to the run dir's files are relative.

The text is jinja2 templates (toolkit/reports/templates, package data), autoescaped: every value from a run dir
(node names, log lines, a recipe's name) reaches the page HTML-escaped. The figures are the reports' own
(toolkit.reports.plots: matplotlib, as `hpc report run --plot` and `report goodput --plot` draw them), and the
numbers are those the commands print: the goodput ledger (toolkit.reports.goodput), the run summary (loss,
throughput, stragglers, the network NCCL used, nccl-tests bandwidth: toolkit.reports.scaling.read_run), the
pre-flight and restart records, and the scaling table across the runs of one recipe.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import io
import os
from pathlib import Path
from typing import Any

from toolkit.errors import HpcError
from toolkit.reports.goodput import KINDS, Ledger, ledger as goodput_ledger, totals
from toolkit.rundir import RunDir

INDEX = "index.html"


def _png(fig: Any) -> str:
    """A matplotlib figure as a data: URI (the page carries its images)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 600:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min" if value < 7200 else f"{value / 3600:.2f} h"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def page_name(run: RunDir) -> str:
    return f"{run.name}.html"


def _ledger_view(led: Ledger) -> dict[str, Any]:
    summary = led.summary()
    wall = summary["wall_s"] or 1.0
    return {
        "summary": summary, "goodput": _percent(summary["goodput"]), "goodput_paid": _percent(summary["goodput_paid"]),
        "wall": _seconds(summary["wall_s"]), "unattributed": _seconds(summary["unattributed_s"]),
        "kinds": [{"kind": k, "what": KINDS[k][0], "colour": KINDS[k][1], "time": _seconds(v),
                   "share": _percent(v / wall)} for k, v in summary["seconds"].items() if v > 0],
        "faults": [{**dataclasses.asdict(f), "at": _when(f.at), "lost": _seconds(f.lost_s),
                    "down": _seconds(f.downtime_s)} for f in led.faults],
        "cost": (f"{summary['cost_usd']:.2f} USD (productive {summary['productive_cost_usd']:.2f} USD; "
                 f"{summary['price']})" if summary["cost_usd"] is not None else summary["price"]),
        "gpu_hours": summary["gpu_hours"], "productive_gpu_hours": summary["productive_gpu_hours"],
        "outcome": led.outcome, "missing": led.missing, "notes": led.notes, "step_source": led.step_source,
        "start": _when(led.start), "end": _when(led.end),
    }


def _plan_rows(run: RunDir) -> list[dict[str, str]]:
    meta = run.metadata()
    rows = []
    if meta is not None:
        for key in ("recipe", "profile", "queue", "instance_type", "fabric", "nodes", "ranks_per_node", "ranks",
                    "gpus", "executor", "launcher_style", "submitted_by", "submitted_at", "toolkit_version",
                    "recipes_git_commit"):
            value = getattr(meta, key)
            if value is not None:
                rows.append({"key": key.replace("_", " "), "value": str(value), "rule": ""})
        if meta.overrides:
            rows.append({"key": "--set", "value": " ".join(meta.overrides), "rule": ""})
    for derived in run.derived():
        rows.append({k: str(derived.get(k, "")) for k in ("key", "value", "rule")})
    return rows


def _records(entries: list[dict[str, Any]], fields: tuple[str, ...]) -> list[dict[str, str]]:
    rows = []
    for entry in entries:
        row = {f: "" if entry.get(f) is None else (_when(entry[f]) if f == "time" and isinstance(entry[f], float)
                                                     else _text(entry[f])) for f in fields}
        rows.append(row)
    return rows


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_text(v)}" for k, v in value.items())
    return str(value)


def run_view(run: RunDir, out_dir: Path) -> dict[str, Any]:
    """What one run's page shows (the template only lays it out)."""
    from toolkit.reports.plots import goodput_figure, stragglers_figure, training_figure
    from toolkit.reports.scaling import read_run

    led = goodput_ledger(run)
    view: dict[str, Any] = {"name": run.name, "run_dir": os.path.relpath(run.path, out_dir), "plan": _plan_rows(run),
                            "ledger": _ledger_view(led), "missing": []}
    view["timeline"] = _png(goodput_figure([led])) if led.segments else None
    try:
        summary = read_run(run.path)
    except HpcError as exc:
        summary = None
        view["missing"].append(f"training records or nccl-tests results: {exc.message}")
    view["summary"] = summary
    view["curves"] = None
    stragglers = summary.stragglers if summary and summary.stragglers else None
    if summary and summary.training:
        t = summary.training
        view["training"] = {"throughput": f"{t['throughput']:.1f} {t['unit']}" if t["throughput"] else "-",
                            "note": t["throughput_note"], "updates": t["updates"],
                            "final_loss": "-" if t["final_loss"] is None else f"{t['final_loss']:.3f}",
                            "top1": None if t["final_top1"] is None else f"{t['final_top1']:.2f}%",
                            "log": os.path.relpath(summary.log, out_dir) if summary.log else None}
        try:
            view["curves"] = _png(training_figure(t, stragglers if stragglers and stragglers["ranks"] else None,
                                                  run.name))
        except HpcError as exc:
            view["missing"].append(exc.message)
    else:
        view["training"] = None
    view["stragglers"] = None
    if stragglers:
        view["stragglers"] = {
            "ranks": [{"rank": r["rank"], "node": r["node"], "steps": r["steps"], "step": f"{r['step_ms']:.0f}",
                       "phases": {p: f"{r['phases_ms'][p]:.0f}" if p in r["phases_ms"] else "-"
                                  for p in ("data", "compute", "sync")},
                       "ratio": f"{r['vs_baseline']:.2f}x", "verdict": "SLOW: " + r["cause"] if r["slow"] else "ok"}
                      for r in stragglers["ranks"]],
            "lines": stragglers["lines"], "note": stragglers["note"],
            "figure": _png(stragglers_figure(stragglers["ranks"], stragglers["baseline_own_ms"],
                                             stragglers["threshold"])) if stragglers["ranks"] and
            stragglers["baseline_own_ms"] else None}
    elif not run.heartbeats():
        view["missing"].append("heartbeats (heartbeats/rank-N.json): no per-rank step phases")
    view["network"] = summary.transport if summary else None
    view["efa_problem"] = summary.efa_problem if summary else None
    view["nccl"] = [{"test": t["test"] or "nccl test", "max": t["max_busbw_gbs"], "avg": t["avg_busbw_gbs"],
                     "verdict": f"{t['verdict']['status']}: {t['verdict']['reason']}"}
                    for t in (summary.nccl or [])] if summary else []
    view["preflights"] = _records(run.preflights(), ("job", "time", "seconds", "nodes", "action", "failed"))
    view["restarts"] = _records(run.restarts(), ("job_id", "time", "kind", "round", "nodes", "trigger", "why"))
    hang = run.hang()
    view["hang"] = hang.get("lines") if hang else None
    view["missing"] += led.missing
    return view


def _scaling_view(runs: list[RunDir]) -> dict[str, Any] | None:
    """The scaling table and plot over the runs with throughput (a recipe's runs at different node counts)."""
    from toolkit.reports.plots import scaling_figure
    from toolkit.reports.scaling import read_run, scaling

    summaries = []
    for run in runs:
        try:
            summary = read_run(run.path)
        except HpcError:
            continue
        if summary.throughput:
            summaries.append(summary)
    if len({s.ranks for s in summaries}) < 2:
        return None
    try:
        rows = scaling(summaries)
    except HpcError:
        return None
    unit = summaries[0].unit or ""
    return {"unit": unit, "rows": [{"run": Path(r.run_dir).name, "page": f"{Path(r.run_dir).name}.html",
                                    "nodes": r.nodes or "?", "ranks": r.ranks, "throughput": f"{r.throughput:.1f}",
                                    "speedup": f"{r.speedup:.2f}x", "ideal": f"{r.ideal_throughput:.1f}",
                                    "efficiency": f"{r.efficiency:.0%}"} for r in rows],
            "figure": _png(scaling_figure(rows, unit, f"{summaries[0].recipe or 'run'} scaling"))}


def _environment():
    import jinja2

    return jinja2.Environment(loader=jinja2.PackageLoader("toolkit.reports", "templates"),
                              autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                              lstrip_blocks=True)


def write_pages(runs: list[RunDir], out_dir: Path) -> list[Path]:
    """One page per run and the index, in out_dir; returns the paths written (the index last)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HpcError(f"cannot create {out_dir}: {exc.strerror}", fix="choose a writable directory for -o") from None
    env = _environment()
    written, index_rows, ledgers = [], [], []
    made = _when(dt.datetime.now(dt.timezone.utc).timestamp())
    for run in runs:
        view = run_view(run, out_dir)
        path = out_dir / page_name(run)
        path.write_text(env.get_template("run.html.j2").render(run=view, made=made, index=INDEX))
        written.append(path)
        led = goodput_ledger(run)
        ledgers.append(led)
        training = view["training"] or {}
        index_rows.append({"name": run.name, "page": page_name(run), "recipe": led.recipe or "?",
                           "jobs": ", ".join(led.job_ids) or "-", "outcome": led.outcome,
                           "wall": view["ledger"]["wall"], "goodput": view["ledger"]["goodput"],
                           "faults": len(led.faults), "throughput": training.get("throughput", "-")})
    from toolkit.reports.plots import goodput_figure

    all_totals = totals(ledgers)
    index = {"runs": index_rows, "goodput": _percent(all_totals["goodput"]), "wall": _seconds(all_totals["wall_s"]),
             "productive": _seconds(all_totals["seconds"]["productive"]),
             "timeline": _png(goodput_figure(ledgers)) if any(led.segments for led in ledgers) else None,
             "scaling": _scaling_view(runs)}
    path = out_dir / INDEX
    path.write_text(env.get_template("index.html.j2").render(index=index, made=made))
    written.append(path)
    return written
