"""`hpc report`: nccl-tests bandwidth with a verdict, one run's summary, scaling efficiency across runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import List, Optional

import typer

from toolkit.cli import options as o
from toolkit.cli.output import JSON_OPTION, emit, fail, info, plot_target, table, warn
from toolkit.reports.stragglers import DEFAULT_THRESHOLD  # standard library only

app = typer.Typer(help="Reports from logs and run dirs: nccl-tests bandwidth, one run, scaling efficiency, goodput, "
                  "run pages.",
                  no_args_is_help=True, rich_markup_mode=None)

PLOT_OPTION = typer.Option(None, "--plot", help="Also write a PNG plot to this file.")


def _num(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _test_name(test: dict) -> str:
    return test["test"] or "unknown test"


def _nccl_text(data: dict) -> str:
    out = []
    for test in data["tests"]:
        out.append(f"== {test['source']}: {_test_name(test)}  ranks={test['ranks'] or '?'} "
                   f"nodes={test['nodes'] or '?'} transport={test['transport'] or '?'}  [{test['format']}]")
        if test["count_note"]:
            out.append(f"rank/node count: {test['count_note']}")
        rows = []
        for r in test["rows"]:
            cells = [r["size"], r["count"], r["dtype"], r["redop"]]
            for m in (r["out_of_place"], r["in_place"]):
                if not m:
                    cells += ["", "", "", ""]
                    continue
                wrong = m["wrong"] if m["wrong"] is not None else (
                    f"{m['error']:g}" if m["error"] is not None else "N/A")
                cells += [_num(m["time_us"]), _num(m["algbw_gbs"]), _num(m["busbw_gbs"]), wrong]
            rows.append(cells)
        out.append(table(rows, ["size(B)", "count", "type", "redop", "time(us)", "algbw", "busbw", "#wrong",
                                "in-place time", "algbw", "busbw", "#wrong"]))
        wrong = test["wrong_values"] if test["wrong_values"] is not None else "-"
        out.append(f"max busbw {_num(test['max_busbw_gbs'])} GB/s at {test['max_busbw_size']} B; "
                   f"avg busbw {_num(test['avg_busbw_gbs'], 3)} GB/s; wrong values {wrong}")
        v = test["verdict"]
        out.append(f"verdict: {v['status']}: {v['reason']}")
        if v["source"]:
            out.append(f"  floor source: {v['source']}")
        out.append("")
    for error in data["errors"]:
        out.append(f"unreadable: {error['source']}: {error['error']} (fix: {error['fix']})")
    out.append(f"overall: {data['status']}")
    return "\n".join(out)


@app.command("nccl")
def nccl(
    logs: List[Path] = typer.Argument(..., help="nccl-tests (or collectives workload) logs, text or -J JSON."),
    as_json: bool = JSON_OPTION,
    plot: Optional[Path] = PLOT_OPTION,
    instance: Optional[str] = typer.Option(None, "--instance", metavar="INSTANCE_TYPE",
                                           help="Instance type, to judge against its catalog floor."),
    nodes: Optional[int] = typer.Option(None, "--nodes", min=1,
                                        help="Nodes in the run (default: NCCL's nNodes, or a complete device list; "
                                        "else at least ranks / GPUs per --instance)."),
    transport: Optional[o.Transport] = typer.Option(None, "--transport", help="The floor to judge against "
                                                    "(default: the instance's own, efa when it has it)."),
    record: bool = typer.Option(False, "--record", help="Add the runs that did not fail to the fleet's baselines "
                                "(the node ledger's; needs --instance and a known node count)."),
    force: bool = o.FORCE,
) -> None:
    """Per-size bandwidth table, max/average bus bandwidth, wrong values and a PASS/WARN/FAIL/NO-VERDICT verdict.

    Each run is judged at the largest message size it ran, against the catalog floor measured at the largest size
    up to it. A type whose accelerator family has its own published reference (--instance dl1.24xlarge: Intel's
    DL1 EFA peer-direct figures, 32 devices at 32 MB) is judged against that instead.

    Exit 1 when any test fails (bandwidth under a floor from a published measured run, or wrong values). Under an
    estimated floor (no published run of that instance and node count) the verdict is WARN and the exit 0.
    """
    from toolkit.errors import UsageError
    from toolkit.health.fleet import fleet_dir
    from toolkit.node import ledger
    from toolkit.reports import nccl as nccl_report

    plot_target(plot, force)
    paths: list[str | Path] = list(logs)
    where = fleet_dir()
    if record and (instance is None or where is None):
        raise UsageError("--record adds to the fleet's baselines of an instance type",
                         fix=f"give --instance TYPE, and run on the cluster (or set {ledger.FLEET_DIR_ENV})")
    verdict = nccl_report.fleet_verdict(ledger.read(where)) if where else nccl_report.verdict_for
    data, tests = nccl_report.report(paths, instance, nodes, o.value(transport), verdict=verdict)
    if record and where is not None and instance is not None:
        samples = nccl_report.fleet_samples(tests, [t["verdict"] for t in data["tests"]], instance, nodes)
        data["recorded"] = ledger.write(where, samples)
    emit(data, as_json, _nccl_text)
    for error in data["errors"]:  # the other files are reported; the bad ones are named on stderr too
        warn(f"{error['source']}: {error['error']}\n  fix: {error['fix']}")
    if plot:
        from toolkit.reports.plots import nccl_figure, save_png

        floors = [t["verdict"]["floor_busbw_gbs"] for t in data["tests"] if t["verdict"]["floor_busbw_gbs"]]
        info(f"plot: {save_png(nccl_figure(tests, floors[0] if floors else None), plot)}")
    if data["status"] == "FAIL":
        raise fail("an nccl test failed: see its verdict")


def _run_text(run) -> str:
    if run.log_only:
        lines = [f"log {run.log} (a plain log: no run dir metadata)"]
    else:
        lines = [f"run {run.run_dir}: recipe {run.recipe or '?'}" + (f" (profile {run.profile})" if run.profile else "")
                 + f", nodes {run.nodes or '?'}, ranks {run.ranks or '?'}" + (f", GPUs {run.gpus}" if run.gpus else "")
                 + (f", job {', '.join(run.job_ids)}" if run.job_ids else ""), f"log: {run.log}"]
    if run.transport:
        evidence = f" ({run.transport['evidence']})" if run.transport["evidence"] else ""
        lines.append(f"network: {run.transport['label']}{evidence}")
    if run.efa_problem:
        lines.append(f"WARNING: {run.efa_problem}")
    if run.result:
        lines.append(f"rank 0 exit code {run.result.get('exit_code')} on {run.result.get('host', '?')}")
    if run.training:
        t = run.training
        lines += [f"throughput: {_num(t['throughput'], 1)} {t['unit']} ({t['throughput_note']})",
                  f"updates: {t['updates']}, epochs: {t['epochs']}, final loss: {_num(t['final_loss'], 3)} "
                  f"(base {t['loss_base']}), {len(t['loss_curve'])} loss points, "
                  f"{len(t['valid_curve'])} validation points"]
        if t["loss_curve"]:
            curve = t["loss_curve"]
            shown = curve if len(curve) <= 12 else curve[:6] + [None] + curve[-5:]
            lines.append("loss: " + " ".join("..." if p is None else f"{p[0]}:{p[1]:.3f}" for p in shown))
        if t["final_top1"] is not None:
            lines.append(f"top-1 accuracy: {t['final_top1']:.2f}%")
        if t["status"]:
            lines.append(f"trainer: {t['status']} after {t['starts']} start(s)")
    straggling = run.stragglers
    if straggling and straggling["ranks"]:
        lines.append(f"step time per rank (ms; own work = data + compute, baseline (lower quartile) "
                     f"{straggling['baseline_own_ms']:.0f}):")
        lines += ["  " + line for line in table(
            [[r["rank"], r["node"], r["steps"], f"{r['step_ms']:.0f}",
              *(f"{r['phases_ms'][p]:.0f}" if p in r["phases_ms"] else "-" for p in ("data", "compute", "sync")),
              f"{r['vs_baseline']:.2f}x", f"{r['windows_over']}/{r['windows']}" if r["windows"] else "-",
              "SLOW: " + r["cause"] if r["slow"] else "ok"] for r in straggling["ranks"]],
            ["RANK", "NODE", "STEPS", "STEP", "DATA", "COMPUTE", "SYNC", "OWN/BASELINE", "WINDOWS OVER", "VERDICT"]
        ).splitlines()]
        lines += [f"straggler: {line}" for line in straggling["lines"]]
    if straggling and straggling["note"]:
        lines.append(f"stragglers: not judged: {straggling['note']}")
    for test in run.nccl or []:
        lines.append(f"{_test_name(test)}: max busbw {_num(test['max_busbw_gbs'])} GB/s, "
                     f"avg {_num(test['avg_busbw_gbs'], 3)} GB/s, wrong values {test['wrong_values']}, "
                     f"verdict {test['verdict']['status']}: {test['verdict']['reason']}")
    return "\n".join(lines)


@app.command("run")
def run(run_dir: Path = typer.Argument(..., help="A run directory (with metadata.json and its logs), or one log file."),
        as_json: bool = JSON_OPTION,
        plot: bool = typer.Option(False, "--plot", help="Also draw a PNG: loss and throughput over the steps, and "
                                  "each rank's step time by phase when the run has the ranks' heartbeats. Written "
                                  "beside the log (LOG with .png for its suffix) unless -o names the file."),
        output: Optional[Path] = typer.Option(None, "--output", "-o", metavar="FILE.png",
                                              help="Where --plot writes (implies --plot)."),
        straggler_threshold: float = typer.Option(DEFAULT_THRESHOLD, "--straggler-threshold", min=0.01,
                                                  metavar="FRACTION", help="Flag ranks whose own work per step (data "
                                                  "+ compute) exceeds the faster ranks' (lower quartile) by this "
                                                  "fraction in significantly many of the run's step windows (a "
                                                  "sign test at 5% over the ranks)."),
        force: bool = o.FORCE) -> None:
    """Summarise one run: throughput (warm-up excluded), loss, updates, or its nccl results; the network NCCL
    used; and the straggling ranks, from the ranks' heartbeats. Exit 1 when an nccl test fails, the queue has
    EFA but NCCL used sockets, or a rank straggles."""
    from toolkit.reports.scaling import read_run

    plot_target(output, force)
    summary = read_run(run_dir, straggler_threshold)
    stragglers = summary.stragglers
    recorded = _record_stragglers(summary, run_dir)
    baselines = _record_baselines(summary, run_dir)
    emit({**dataclasses.asdict(summary), "fleet_recorded": recorded, "fleet_baselines_recorded": baselines},
         as_json, lambda _: _run_text(summary)
         + (f"\nrecorded in the fleet's node ledger: straggler finding(s) on {', '.join(recorded)}" if recorded else "")
         + (f"\nrecorded in the fleet's baselines: {baselines} healthy result(s) of this job" if baselines else ""))
    if plot or output:
        info(f"plot: {_plot_run(summary, run_dir, output)}")
    if summary.efa_problem and as_json:  # the text output shows it already
        warn(summary.efa_problem)
    if summary.efa_problem:
        raise fail(summary.efa_problem)
    if stragglers and stragglers["lines"]:
        raise fail(f"straggler: {stragglers['lines'][0]}")
    if summary.nccl and any(t["verdict"]["status"] == "FAIL" for t in summary.nccl):
        raise fail("an nccl test failed: see its verdict")


def _record_stragglers(summary, run_dir: Path) -> list[str]:
    """The verdict's slow nodes, recorded in the fleet's ledger of the run's job (toolkit.health.fleet), where it
    has one: the next jobs leave a node out once the policy's strikes are in (a pre-flight's, a lost node's)."""
    stragglers = summary.stragglers
    if not (stragglers and stragglers["lines"] and summary.job_ids and run_dir.is_dir()):
        return []
    from toolkit.health import fleet

    return fleet.record_stragglers(stragglers, str(summary.job_ids[-1]), fleet.run_fleet_dir(run_dir))


def _record_baselines(summary, run_dir: Path) -> int:
    """A collectives or nccl-tests run's results that pass the fleet's own judgement, added to its baselines
    (toolkit.reports.baseline) in the ledger the job's plan names: what `hpc report nccl --record` does, done for
    every such run that is reported (a job counts once however often). The records added."""
    if not (summary.nccl and summary.job_ids and summary.log and run_dir.is_dir()):
        return 0
    from toolkit.health import fleet
    from toolkit.node import ledger
    from toolkit.reports import nccl
    from toolkit.rundir import RunDir

    where = fleet.run_fleet_dir(run_dir)
    meta = RunDir(run_dir).metadata()
    instance = meta.instance_type if meta else None
    if where is None or not instance:
        return 0
    records = ledger.read(where)
    job = str(summary.job_ids[-1])
    if any(r.get("type") == "baseline" and r.get("job") == job for r in records):
        return 0  # reported before
    tests = nccl.parse_text(Path(summary.log).read_text(errors="replace"), summary.log)
    judge = nccl.fleet_verdict(records)
    verdicts = [dataclasses.asdict(judge(t, instance, summary.nodes, None)) for t in tests]
    samples = nccl.fleet_samples(tests, verdicts, instance, summary.nodes, job=job)
    try:
        return ledger.write(where, samples) if samples else 0
    except OSError as exc:
        warn(f"could not record in the fleet's baselines ({where}): {exc.strerror}")
        return 0


def _plot_run(summary, run_dir: Path, output: Path | None) -> Path:
    """Draw `hpc report run --plot`: training curves (with the ranks' step times when there are heartbeats), or
    the step times alone; written to `output`, else beside the log the summary was read from."""
    from toolkit.errors import HpcError
    from toolkit.reports.plots import save_png, stragglers_figure, training_figure

    stragglers = summary.stragglers if summary.stragglers and summary.stragglers["ranks"] else None
    title = f"{summary.recipe or Path(summary.log or run_dir).name}"
    if summary.training:
        figure = training_figure(summary.training, stragglers, title)
    elif stragglers:
        figure = stragglers_figure(stragglers["ranks"], stragglers["baseline_own_ms"], stragglers["threshold"],
                                   f"{title}: step time per rank")
    else:
        why = f" ({summary.stragglers['note']})" if summary.stragglers and summary.stragglers["note"] else ""
        raise HpcError(f"{run_dir}: nothing to plot: no training records and no per-rank step times{why}",
                       fix="plot a training run (its rank 0 log or run dir); nccl results: `hpc report nccl LOG "
                       "--plot FILE.png`")
    if output is None:
        log = Path(summary.log) if summary.log else Path(run_dir) / "run"
        output = log.with_suffix(".png") if log.suffix != ".png" else log.with_name(log.name + ".plot.png")
    return save_png(figure, output)


@app.command("scaling")
def scaling(run_dirs: List[Path] = typer.Argument(..., help="Run dirs of one recipe at different node counts."),
            as_json: bool = JSON_OPTION, plot: Optional[Path] = PLOT_OPTION, force: bool = o.FORCE) -> None:
    """Throughput, speed-up and scaling efficiency against the smallest run; optional PNG vs ideal scaling."""
    from toolkit.reports.scaling import read_run, scaling as scaling_rows

    plot_target(plot, force)
    runs = [read_run(d) for d in run_dirs]
    rows = scaling_rows(runs)
    unit = runs[0].unit
    data = {"recipe": runs[0].recipe, "unit": unit, "baseline": rows[0].run_dir,
            "runs": [dataclasses.asdict(r) for r in rows]}
    emit(data, as_json, lambda _: table(
        [[r.run_dir, r.nodes or "?", r.ranks, _num(r.throughput, 1), f"{r.speedup:.2f}x", _num(r.ideal_throughput, 1),
          f"{r.efficiency:.0%}"] for r in rows],
        ["run", "nodes", "ranks", f"throughput ({unit})", "speed-up", "ideal", "efficiency"]))
    if plot:
        from toolkit.reports.plots import save_png, scaling_figure

        title = f"{runs[0].recipe or 'run'}" + (f" ({runs[0].profile})" if runs[0].profile else "") + " scaling"
        info(f"plot: {save_png(scaling_figure(rows, unit or '', title), plot)}")


def _run_dirs(runs: List[str]) -> list:
    """Each argument as a run dir: a directory, else a job id looked up in the runs root."""
    from toolkit.errors import HpcError
    from toolkit.rundir import RunDir, find_run

    found = []
    for arg in runs:
        path = Path(arg)
        if path.is_dir():
            RunDir(path).read_metadata()  # one clear error for a dir that is no run dir
            found.append(RunDir(path))
            continue
        run = find_run(arg) if arg.replace("_", "").isdigit() else None
        if run is None:
            raise HpcError(f"{arg} is neither a run dir nor a job id with a run dir in the runs root",
                           fix="pass the run directory `hpc recipes submit` printed, or its job id (HPC_RUNS_DIR "
                               "names the runs root)")
        found.append(run)
    return found


def _seconds(value: float) -> str:
    if value < 600:
        return f"{value:.1f} s" if value < 60 else f"{value:.0f} s"
    return f"{value / 60:.1f} min" if value < 7200 else f"{value / 3600:.2f} h"


def _goodput_text(data: dict) -> str:
    from toolkit.reports.goodput import KINDS

    out = []
    for run in data["runs"]:
        wall = run["wall_s"] or 1.0
        out.append(f"== {run['run_dir']}: {run['recipe'] or '?'}, job {', '.join(run['job_ids']) or '?'}, "
                   f"{run['outcome']}, wall {_seconds(run['wall_s'])}")
        rows = [[k, _seconds(v), f"{v / wall:.1%}", KINDS[k][0]] for k, v in run["seconds"].items() if v > 0]
        out.append(table(rows, ["KIND", "TIME", "SHARE", "WHAT"]))
        good = "-" if run["goodput"] is None else f"{run['goodput']:.1%}"
        paid = "-" if run["goodput_paid"] is None else f"{run['goodput_paid']:.1%}"
        out.append(f"goodput {good} of the wall time, {paid} of the time the nodes were held; parts add up to "
                   f"{run['attributed_s'] + run['unattributed_s']:.1f} s of {run['wall_s']:.1f} s, "
                   f"{run['unattributed_s']:.1f} s unattributed")
        if run["gpu_hours"] is not None:
            out.append(f"GPU-hours held {run['gpu_hours']:.3f}, productive {run['productive_gpu_hours']:.3f}")
        out.append("cost: " + (f"{run['cost_usd']:.2f} USD, productive {run['productive_cost_usd']:.2f} USD "
                               f"({run['price']})" if run["cost_usd"] is not None else run["price"]))
        for n, f in enumerate(run["fault_list"], 1):
            out.append(f"fault {n}: {f['cause']}: last step {f['last_step']}, resumed from {f['resumed_from']}, "
                       f"{f['steps_lost']} step(s) lost ({f['lost_s']:.1f} s), down {f['downtime_s']:.1f} s "
                       "(fault to next step)")
        out += [f"missing: {m}" for m in run["missing"]] + [f"note: {n}" for n in run["notes"]]
        out.append("")
    if len(data["runs"]) > 1:
        rows = [[r["run_dir"].rsplit("/", 1)[-1], _seconds(r["wall_s"]), _seconds(r["seconds"]["productive"]),
                 "-" if r["goodput"] is None else f"{r['goodput']:.1%}", r["steps_lost"], r["faults"]]
                for r in data["runs"]]
        t = data["totals"]
        rows.append(["total", _seconds(t["wall_s"]), _seconds(t["seconds"]["productive"]),
                     "-" if t["goodput"] is None else f"{t['goodput']:.1%}",
                     sum(r["steps_lost"] for r in data["runs"]), sum(r["faults"] for r in data["runs"])])
        out.append(table(rows, ["RUN", "WALL", "PRODUCTIVE", "GOODPUT", "STEPS LOST", "FAULTS"]))
    return "\n".join(out).rstrip()


@app.command("goodput")
def goodput(runs: List[str] = typer.Argument(..., metavar="RUN_DIR|JOB_ID...", help="Run dirs, or job ids."),
            as_json: bool = JSON_OPTION, plot: Optional[Path] = PLOT_OPTION, force: bool = o.FORCE) -> None:
    """Where each job's time went, from its submission to its end: queue, pre-flight, start-up, productive steps,
    checkpoint saves, steps lost to restarts and requeues, downtime per fault, hangs, the tail; goodput =
    productive / wall time, per GPU-hour, and in cost where the catalog has a price. Read from the run dirs only."""
    from toolkit.reports import goodput as ledger_report

    plot_target(plot, force)
    found = ledger_report.ledgers(_run_dirs(runs))
    data = {"runs": [led.to_json() for led in found], "totals": ledger_report.totals(found)}
    emit(data, as_json, _goodput_text)
    if plot:
        from toolkit.reports.plots import goodput_figure, save_png

        info(f"plot: {save_png(goodput_figure(found), plot)}")


@app.command("html")
def html(runs: List[str] = typer.Argument(..., metavar="RUN_DIR|JOB_ID...", help="Run dirs, or job ids."),
         output: Path = typer.Option(..., "--output", "-o", metavar="DIR", help="Where the pages go."),
         as_json: bool = JSON_OPTION) -> None:
    """One self-contained HTML page per run (plan, goodput timeline, loss and throughput, per-rank step phases and
    stragglers, pre-flights and restarts, the network NCCL used and its bus bandwidth) and an index across them
    with the scaling table. No network is needed to open them: figures are inside the pages, links relative."""
    from toolkit.reports.page import write_pages

    written = write_pages(_run_dirs(runs), output)
    emit({"pages": [str(p) for p in written], "index": str(written[-1])}, as_json,
         lambda data: "\n".join(data["pages"]))
