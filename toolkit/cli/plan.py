"""`hpc plan`: time, cost and efficiency at N nodes, predicted from calibration runs or typed figures.

`hpc plan RECIPE ...` predicts (the `predict` command: a first word that is not a command of the group goes
there); `hpc plan calibrate RECIPE ...` submits the calibration runs. Not `hpc recipes submit`'s plan (the
submission plan, toolkit.submit.plan): this one is the sizing planner, toolkit.planner.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from typer.core import TyperGroup

from toolkit.cli import options as o
from toolkit.cli.output import JSON_OPTION, emit, info, table, warn


class _PredictByDefault(TyperGroup):
    """A group whose first word, when it is not one of its commands (nor --help), is `predict`'s RECIPE."""

    default_command = "predict"  # tests/test_docs_commands.py resolves `hpc plan RECIPE` through it too

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)


app = typer.Typer(cls=_PredictByDefault, no_args_is_help=True, rich_markup_mode=None,
                  help="Size a job before booking it: throughput, efficiency, time and cost at N nodes, predicted "
                       "from short calibration runs (hpc plan calibrate) or typed figures. `hpc plan RECIPE ...` "
                       "is `hpc plan predict RECIPE ...`.")

NODE_COUNTS = typer.Option(..., "--nodes", "-N", metavar="N,N,...", help="Node counts, comma-separated (e.g. 1,2,4,8).")
PLAN_SET = typer.Option([], "--set", metavar="KEY.PATH=VALUE", help="Override a recipe value, as when submitting.")


def _counts(text: str) -> list[int]:
    from toolkit.errors import UsageError

    try:
        counts = [int(part) for part in text.split(",")]  # an empty part (1,,2) is a typo, not nothing
    except ValueError:
        counts = []
    if not counts:
        raise UsageError(f"--nodes {text!r} is not a list of node counts", fix="e.g. --nodes 1,2,4,8")
    if any(n < 1 for n in counts):  # the message `hpc recipes render --nodes 0` gives
        raise UsageError(f"--nodes {text}: the least a node count takes is 1", fix="e.g. --nodes 1,2,4,8")
    return counts


def _duration(seconds: float) -> str:
    minutes = seconds / 60
    if minutes < 1:
        return f"{seconds:.0f} s"
    if minutes < 120:
        return f"{minutes:.1f} min"
    return f"{minutes / 60:.1f} h"


def _money(value: float | None) -> str:
    return "no price" if value is None else f"${value:,.2f}" if value < 1000 else f"${value:,.0f}"


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _plan_text(data: dict) -> str:
    unit = "samples/s"
    target = data["target"]
    what = (f"{target['value']} epochs x {target['samples_per_epoch']:,.0f} samples" if target["kind"] == "epochs"
            else f"{target['value']} updates")
    lines = [f"plan: {data['recipe']}" + (f" --profile {data['profile']}" if data["profile"] else "")
             + f" on {data['instance_type']} ({data['ranks_per_node']} ranks per node"
             + (f", queue {data['queue']}" if data["queue"] else "") + f"); target {what} ({target['source']})"]
    spread = (f" (band: +-{data['spread']:.0%}, the spread of the calibration runs or of the typed ranges)"
              if data["spread"] else "")
    rows = []
    for r in data["rows"]:
        band = f" ({_duration(r['time_low_s'])}-{_duration(r['time_high_s'])})" if data["spread"] else ""
        cost = _money(r["cost_usd"]) + (f" ({_money(r['cost_low_usd'])}-{_money(r['cost_high_usd'])})"
                                        if data["spread"] and r["cost_usd"] is not None else "")
        rules = ", ".join(f"{s['flag']} {s['value']}" for s in r["scaling"]) or "-"
        rows.append([r["nodes"], r["ranks"], f"{r['global_batch']:g}", _rate(r["throughput"]),
                     f"{r['efficiency']:.0%}", _duration(r["time_s"]) + band, cost, r["bound"], rules])
    lines.append(table(rows, ["NODES", "RANKS", "BATCH", f"THROUGHPUT ({unit})", "EFFICIENCY", "TIME", "COST",
                              "BOUND", "SCALING RULES"]))
    if spread:
        lines.append(spread.strip())
    price = data["price"]
    lines.append(f"price: ${price['usd_per_hour']}/h per {price['instance']} ({price['kind'].replace('_', ' ')}, "
                 f"{price['as_of']}; {price['source']})" if price else f"price: {data['price_note']}")
    lines.append("inputs:")
    lines += [f"  {i['name']}: {i['value']}  [{i['source']}]" for i in data["inputs"]]
    lines += [f"note: {note}" for note in data["notes"]]
    return "\n".join(lines)


@app.command("predict")
def predict(recipe: str = o.RECIPE, nodes: str = NODE_COUNTS, cluster: Optional[Path] = o.CLUSTER,
            queue: Optional[str] = o.QUEUE,
            instance_type: Optional[str] = typer.Option(None, "--instance-type", metavar="TYPE",
                                                        help="Plan for an instance type without a cluster config."),
            profile: Optional[str] = o.PROFILE, overrides: list[str] = PLAN_SET,
            runs: list[Path] = typer.Option([], "--from", metavar="RUN_DIR",
                                            help="Calibration run dirs (default: the calibration record of the recipe "
                                                 "and queue, written by `hpc plan calibrate`). Repeatable."),
            throughput_1node: Optional[str] = typer.Option(None, "--throughput-1node", metavar="SAMPLES_PER_S",
                                                           help="Typed: one node's throughput (images/s, words/s); "
                                                                "LOW..HIGH for a range."),
            busbw: Optional[str] = typer.Option(None, "--busbw", metavar="GB_PER_S",
                                                help="Typed: all-reduce bus bandwidth between nodes (GB/s)."),
            assume: list[str] = typer.Option([], "--assume", metavar="KEY=VALUE",
                                             help="Typed: any model input (parameters, samples_per_epoch, hidden, "
                                                  "latency_us, loader_rate_1node, bytes_per_sample, fsx_mbps, "
                                                  "samples_per_rank_step, shared_host). Repeatable."),
            inputs_file: Optional[Path] = typer.Option(None, "--inputs", metavar="FILE.yaml",
                                                       help="Typed inputs as a YAML mapping of KEY: VALUE."),
            target: Optional[str] = typer.Option(None, "--target", metavar="epochs|updates",
                                                 help="What to time (default: the recipe's updates where it sets "
                                                      "them, else its epochs)."),
            plot: Optional[Path] = typer.Option(None, "--plot", metavar="FILE.png",
                                                help="Also draw time and cost against the node count."),
            force: bool = o.FORCE, as_json: bool = JSON_OPTION) -> None:
    """Predict throughput, efficiency, time to the recipe's target, cost and the bound at each node count."""
    from toolkit.cli.output import plot_target
    from toolkit.errors import UsageError
    from toolkit.planner import inputs
    from toolkit.planner.predict import TARGETS, PlanRequest, predict as run_predict, recorded_runs

    plot_target(plot, force)
    if target is not None and target not in TARGETS:
        raise UsageError(f"--target {target!r} is not one of {', '.join(TARGETS)}", fix="--target epochs")
    typed = inputs.parse(assume, inputs_file, throughput_1node=throughput_1node, busbw=busbw)
    request = PlanRequest(recipe, _counts(nodes), str(cluster) if cluster else None, queue, instance_type, profile,
                          tuple(overrides), tuple(str(r) for r in runs), typed, target)
    recorded = [] if runs or instance_type else recorded_runs(request)
    data = run_predict(request, recorded)
    for warning in data["warnings"]:
        warn(warning)
    emit(data, as_json, _plan_text)
    if plot:
        from toolkit.reports.plots import plan_figure, save_png

        title = f"{data['recipe']} on {data['instance_type']}"
        info(f"plot: {save_png(plan_figure(data['rows'], title), plot)}")


@app.command("calibrate")
def calibrate(recipe: str = o.RECIPE, nodes: str = typer.Option("1,2", "--nodes", "-N", metavar="N,N,...",
                                                                help="Node counts to calibrate at (1 and more)."),
              cluster: Optional[Path] = o.CLUSTER, queue: Optional[str] = o.QUEUE,
              profile: Optional[str] = typer.Option(None, "--profile", metavar="PROFILE",
                                                    help="The recipe's profile to run (default: its `calibrate` "
                                                         "profile where it has one)."),
              steps: Optional[int] = typer.Option(None, "--steps", min=2, metavar="N",
                                                  help="Stop each run after N updates (--max-steps, --max-update)."),
              overrides: list[str] = PLAN_SET,
              collectives: bool = typer.Option(True, "--collectives/--no-collectives",
                                               help="Also measure the all-reduce bus bandwidth on the largest count."),
              as_json: bool = JSON_OPTION) -> None:
    """Submit short calibration runs (one after another) and record them for `hpc plan RECIPE`."""
    from toolkit.planner.calibrate import calibrate as run_calibrate

    result = run_calibrate(recipe, _counts(nodes), str(cluster) if cluster else None, queue, profile,
                           tuple(overrides), steps, collectives, info)
    emit(result, as_json, lambda r: f"calibrated {r['recipe']} on queue {r['queue']}: {len(r['training'])} training "
                                    f"run(s), {len(r['collectives'])} collectives run(s)\n  record: {r['record']}\n"
                                    f"  next:   hpc plan {r['recipe']} --queue {r['queue']} --nodes 1,2,4,8"
                                    + (f" --profile {r['profile']}" if r["profile"] else ""))
