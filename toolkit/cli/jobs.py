"""`hpc jobs`: list, status, logs and cancel for runs submitted with `hpc recipes submit`."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Optional

import typer

from toolkit.cli.output import JSON_OPTION, emit, fail, info, table, warn

app = typer.Typer(help="Follow and control submitted runs: list, status, logs, cancel.", no_args_is_help=True,
                  rich_markup_mode=None)


@app.command("list")
def list_(json_: bool = JSON_OPTION) -> None:
    """Runs in the runs root ($HPC_RUNS_DIR, else this cluster's FSx <mount>/hpc-runs/$USER and ~/hpc-runs) with
    their jobs' states."""
    from toolkit.submit import runs

    rows = [dataclasses.asdict(s) for s in runs.list_statuses()]
    emit(rows, json_, lambda rs: table([(r["job_id"], r["state"] + _task_counts(r), r["recipe"], r["nodes"],
                                         r["requeues"], r["run_dir"]) for r in rs],
                                       ["JOB", "STATE", "RECIPE", "NODES", "REQUEUES", "RUN DIR"]))


def _progress_lines(progress: dict | None) -> list[str]:
    """The heartbeats' part of `hpc jobs status`: how far the ranks got, who stalled, where their stacks are."""
    if not progress:
        return []
    lines = []
    if progress["ranks"]:
        steps = progress["steps"]
        where = ("no step done yet" if not steps else f"step {steps[1]}" if steps[0] == steps[1] else
                 f"steps {steps[0]}-{steps[1]}")
        lines.append(f"  progress: {progress['ranks']} ranks, {where}, "
                     f"newest heartbeat {progress['newest_beat_s']:.0f} s ago")
    lines += [f"  stalled: {line}" for line in progress["lines"]]
    lines += [f"  stack of rank {rank}: {path}" for rank, path in progress["stacks"].items()]
    if progress.get("no_stack"):
        silent = ", ".join(map(str, progress["no_stack"]))
        lines.append(f"  no stack from rank(s) {silent}: asked, they did not answer (a process stopped, in "
                     "uninterruptible I/O, or its node unreachable: see `ps -o stat` there, and `hpc cluster nodes`)")
    hang = progress["hang"]
    if hang:
        lines.append(f"  hang watchdog: ended the job after {hang['hang_timeout_s']:g} s without progress")
        lines += [f"    {line}" for line in hang.get("lines", [])]
    return lines


def _restart_lines(restarts: list[dict]) -> list[str]:
    """The spares supervisor's records (toolkit.node.spares): restarts, the probes' drains, giving up."""
    import datetime as dt

    lines = []
    for entry in restarts:
        when = dt.datetime.fromtimestamp(entry.get("time", 0), dt.timezone.utc).strftime("%H:%M:%S UTC")
        nodes = ",".join(entry.get("nodes") or []) or "no node"
        kind = entry.get("kind")
        if kind == "gave_up":
            lines.append(f"  gave up at {when}: {entry.get('why')}" + ("; requeued" if entry.get("requeued") else ""))
        elif kind == "probe":
            done = [f"drained {','.join(entry['drained'])}"] if entry.get("drained") else []
            done += [f"{n} not drained: {why}" for n, why in (entry.get("not_drained") or {}).items()]
            lines.append(f"  probe ({'pre-flight' if not entry.get('round') else 'restart ' + str(entry['round'])}): "
                         f"{nodes} failed it; {'; '.join(done)}")
            lines.append(f"    why: {entry.get('why')}")
        else:
            label = "pre-flight" if kind == "pre-flight" else f"restart {entry.get('round')}"
            lines.append(f"  {label}: at {when}, {nodes} left out ({entry.get('trigger')}); last step "
                         f"{entry.get('last_step', '?')}; next on {','.join(entry.get('next_nodes') or []) or '-'}")
            lines.append(f"    why: {entry.get('why')}")
    return lines


def _task_counts(row: dict) -> str:
    """" (3 COMPLETED, 1 FAILED)" for an array (a sweep), else nothing."""
    tasks = row.get("tasks") or {}
    return f" ({', '.join(f'{n} {state}' for state, n in sorted(tasks.items()))})" if tasks else ""


@app.command("status")
def status(job_id: str = typer.Argument(..., help="Slurm job id (an array task: ID_N; a sweep: any of its "
                                                  "arrays' ids)."),
           stall_after: Optional[float] = typer.Option(None, "--stall-after", min=1, metavar="SECONDS",
                                                      help="Call a running rank stalled after this long without "
                                                           "a step (default 120)."),
           stacks: bool = typer.Option(False, "--stacks", help="Collect every rank's Python stacks first (they "
                                                               "tell a stuck rank from those waiting for it)."),
           json_: bool = JSON_OPTION) -> None:
    """State of one job (with the requeue count; array jobs: a count per state), its ranks' progress from their
    heartbeats, and the ranks that stopped progressing (exit 1 when one did)."""
    from toolkit.reports.transport import run_network
    from toolkit.rundir import RunDir
    from toolkit.slurm.status import State
    from toolkit.submit import runs
    from toolkit.slurm.batchhost import recover, summary_lines

    s = runs.status(job_id)
    if s.run_dir and not s.tasks and s.source != "local":
        # A batch host that could not start the script: named in the run dir's records and, where the job can be,
        # requeued without that node (nothing else does: Slurm leaves the job FAILED and the node in service).
        recovery = recover(s.job_id, s.run_dir, s.state, s.exit_code, s.reason)
        if recovery and recovery.pending:
            s = runs.status(job_id)
            if s.done:  # accounting has not caught up with the requeue yet: the controller holds it pending
                s = dataclasses.replace(s, state=State.PENDING, source="scontrol")
    if s.run_dir is None:  # Slurm knows the job; its run dir is elsewhere, or was deleted (a fault probe)
        from toolkit.submit.runsroot import reader_roots

        warn(f"no run dir in {', '.join(str(r) for r in reader_roots())} records job {s.job_id}: its logs, "
             "heartbeats and result are not read (set HPC_RUNS_DIR to where it was submitted from)")
    data = dataclasses.asdict(s)
    run = RunDir(Path(s.run_dir)) if s.run_dir and not s.tasks else None
    network = run_network(run) if run else None
    data["network"] = network.to_json() if network and network.transport.name else None  # None: NCCL said nothing
    slurm_id = None if s.source == "local" else job_id  # a local run's id is a pid, not a Slurm job
    data["progress"] = run and runs.progress(run, slurm_id, s.state == State.RUNNING, stall_after, stacks)
    data["restarts"] = [r for r in run.restarts() if str(r.get("job_id")) == str(s.job_id)] if run else []
    data["torchrun_restarts"] = run.torchrun_restarts(s.job_id) if run else []
    data["preflight"] = run.preflights(s.job_id) if run else []
    failure = None
    if run and s.done and s.state != State.COMPLETED:  # the same culprit `--wait` names
        from toolkit.submit.submission import culprit, failure_message

        found = culprit(s.job_id, run)
        data.update({key: value for key, value in found.items() if key != "preflight"})
        failure = failure_message(s.job_id, s.state, found)
    if stacks and s.state != State.RUNNING:
        warn(f"job {s.job_id} is {s.state}, not running: no stacks to collect")

    def human(d):
        lines = [f"job {d['job_id']}: {d['state']} (from {d['source']})"]
        for key in ("recipe", "nodes", "requeues", "exit_code", "reason", "run_dir"):
            if d[key] not in (None, ""):
                lines.append(f"  {key.replace('_', ' ')}: {d[key]}")
        if d["tasks"]:
            lines.append(f"  tasks: {sum(d['tasks'].values())}:{_task_counts(d)}")
        if d["network"]:
            lines.append(f"  network: {d['network']['label']} ({d['network']['evidence']})")
        from toolkit.submit.submission import torchrun_restart_lines

        return "\n".join(lines + summary_lines(d["preflight"]) + _restart_lines(d["restarts"])
                         + [f"  {line}" for line in torchrun_restart_lines(d["torchrun_restarts"])]
                         + _progress_lines(d["progress"]))

    emit(data, json_, human)
    if data["network"] and data["network"]["problem"]:
        warn(data["network"]["problem"])
    hang = data["progress"] and data["progress"]["hang"]
    if s.done and s.state != State.COMPLETED:
        if hang and hang.get("lines"):
            raise fail(f"job {s.job_id} ended {s.state}: the hang watchdog ended it ({hang['lines'][0]})")
        if failure:
            info(failure)
        raise fail(failure or f"job {s.job_id} ended {s.state}")
    if data["progress"] and data["progress"]["lines"]:
        raise fail(f"job {s.job_id}: {data['progress']['lines'][0]}")
    if data["network"] and data["network"]["problem"]:
        raise fail(data["network"]["problem"])


@app.command("logs")
def logs(job_id: str = typer.Argument(..., help="Slurm job id."),
         rank: int = typer.Option(0, "--rank", "-r", help="Which rank's log (Slurm's task number)."),
         stderr: bool = typer.Option(False, "--stderr", help="Show the rank's stderr instead of stdout."),
         follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the job ends."),
         json_: bool = JSON_OPTION) -> None:
    """Print one rank's log (rank 0 by default). A job sent as its sbatch script (MPI binaries) has one log,
    every rank's stdout and stderr together, each line labelled by srun with its task: that rank's lines are
    printed, unlabelled, with the lines no rank wrote (the batch shell's, srun's errors). With --json, the lines
    come in one envelope at the end (with --follow: when the job ends)."""
    from toolkit.submit import runs

    stream = "err" if stderr else "out"
    lines = []
    for line in runs.rank_lines(job_id, rank, stream=stream, keep_following=follow):
        if json_:
            lines.append(line.rstrip("\n"))
            continue
        sys.stdout.write(line)
        if follow:
            sys.stdout.flush()
    emit({"job_id": job_id, "rank": rank, "stream": stream, "lines": lines}, json_)


@app.command("cancel")
def cancel(job_id: str = typer.Argument(..., help="Slurm job id."), json_: bool = JSON_OPTION) -> None:
    """Cancel a job (scancel; a local run's process); a sweep's id (any of its arrays') cancels all its arrays."""
    from toolkit.submit import runs

    # asked first: scancel says nothing of a job that has ended or never was, and "cancelled" would be untrue
    state = runs.status(job_id)
    if state.done:
        emit({"job_id": job_id, "cancelled": False, "state": state.state, "job_ids": []}, json_,
             f"job {job_id} had already ended ({state.state}): nothing to cancel")
        return
    ids = runs.cancel(job_id)
    emit({"job_id": job_id, "cancelled": True, "job_ids": ids}, json_, f"cancelled job {' '.join(ids)}")
