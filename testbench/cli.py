"""`python -m testbench up|down|status|env`: the project's local test cluster (a real Slurm on this machine)."""

from __future__ import annotations

import shlex
import sys
from typing import Optional

import typer

from toolkit.cli.output import JSON_OPTION, emit, info, table
from toolkit.cluster.queues import CLUSTER_CONFIG_ENV
from toolkit.errors import HpcError

app = typer.Typer(help="Start, stop and inspect the local test cluster (a real Slurm on this machine).",
                  no_args_is_help=True, rich_markup_mode=None, pretty_exceptions_enable=False,
                  add_completion=False)


SLURM_OPTION = typer.Option(None, "--slurm", help="Slurm version: 24.11 (trixie's) or 26.05 (forky's) runs from "
                            "a Debian root file system (built once under /var/tmp); 22.05-pyxis: this machine's "
                            "Slurm with NVIDIA pyxis and enroot (containers); bullseye: this machine's 22.05 "
                            "controller and clients (srun: the nodes' 20.11) with Debian bullseye nodes (slurmd "
                            "20.11, python3 3.9) that share only /fsx with it; default: this machine's own (22.05).")


def _exports(data: dict) -> str:
    """Shell lines that point Slurm's commands and hpc at the cluster, as on a real cluster (`eval` them)."""
    path = f"export PATH={shlex.quote(data['bin'])}:\"$PATH\"\n" if data.get("bin") else ""
    # The node lane's nodes see only its shared dir: runs must be made there.
    runs = f" HPC_RUNS_DIR={shlex.quote(data['runs_dir'])}" if data.get("runs_dir") else ""
    return (f"{path}export SLURM_CONF={shlex.quote(data['slurm_conf'])} "
            f"{CLUSTER_CONFIG_ENV}={shlex.quote(data['cluster_config'])}{runs}")


def _usage(data: dict) -> str:
    return f"{_exports(data)}\n# Slurm {data['slurm']}, default queue: {data['default_queue']}"


def _layout(slurm: Optional[str]):
    from testbench.layout import Layout

    return Layout.current(slurm)


@app.command()
def up(slurm: Optional[str] = SLURM_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Install what is missing and start every daemon that is not running (idempotent)."""
    from testbench import cluster

    data = cluster.up(_layout(slurm))
    if not as_json:
        if data["installed"]:
            info(f"installed: {' '.join(data['installed'])}")
        info(f"started: {' '.join(data['started'])}" if data["started"] else "already up")
    emit(data, as_json, _usage)


@app.command()
def down(slurm: Optional[str] = SLURM_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Stop the daemons this sandbox started (by their pid files)."""
    from testbench import cluster

    stopped = cluster.down(_layout(slurm))
    emit({"stopped": stopped}, as_json, f"stopped: {' '.join(stopped)}" if stopped else "nothing was running")


@app.command()
def status(slurm: Optional[str] = SLURM_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Which daemons run, and the nodes' Slurm states. Exit 1 when the sandbox is not fully up."""
    from testbench import cluster

    data = cluster.status(_layout(slurm))

    def human(d: dict) -> str:
        daemons = table([(x["name"], x["pid"] or "-", "running" if x["running"] else "stopped")
                         for x in d["daemons"]], ["daemon", "pid", "state"])
        nodes = table(sorted(d["nodes"].items()), ["node", "state"]) if d["nodes"] else "nodes: unknown"
        return f"{'up' if d['up'] else 'not up'}\n{daemons}\n\n{nodes}\n\n{_usage(d)}"

    emit(data, as_json, human)
    if not data["up"]:
        raise typer.Exit(1)


@app.command()
def env(slurm: Optional[str] = SLURM_OPTION, as_json: bool = JSON_OPTION) -> None:
    """The variables that point Slurm and hpc at the running cluster: `eval "$(python -m testbench env)"`."""
    from testbench import cluster, discover

    layout = _layout(slurm)
    if discover(layout) is None:
        flag = f" --slurm {slurm}" if slurm else ""
        raise HpcError(f"the local test cluster (Slurm {layout.lane.slurm}) is not running",
                       fix=f"start it: python -m testbench up{flag}")
    data = cluster.summary(layout)
    keys = ("slurm_conf", "cluster_config", "bin", *(k for k in ("shared_dir", "runs_dir") if k in data))
    emit({k: data[k] for k in keys}, as_json, _exports)


def main() -> None:
    try:
        app()
    except HpcError as exc:  # the toolkit's error form: one line and its fix, no traceback
        sys.stderr.write(f"error: {exc.message}\n" + (f"  fix: {exc.fix}\n" if exc.fix else ""))
        sys.exit(exc.exit_code)
