"""`hpc sandbox`: the project's local test cluster (a real Slurm on this machine)."""

from __future__ import annotations

from typing import Optional

import typer

from toolkit.cli.output import JSON_OPTION, emit, info, table

app = typer.Typer(help="Start, stop and inspect the local test cluster (a real Slurm on this machine).",
                  no_args_is_help=True, rich_markup_mode=None)


SLURM_OPTION = typer.Option(None, "--slurm", help="Slurm version: 24.11 runs trixie's Slurm from a Debian root "
                            "file system (built once under /var/tmp); default: this machine's own (22.05).")


def _usage(data: dict) -> str:
    path = f"export PATH={data['bin']}:$PATH  # Slurm {data['slurm']}'s client commands\n" if data.get("bin") else ""
    return (f"{path}export SLURM_CONF={data['slurm_conf']}\n"
            f"cluster config: {data['cluster_config']} (default queue: {data['default_queue']})")


def _layout(slurm: Optional[str]):
    from toolkit.sandbox.layout import Layout

    return Layout.current(slurm)


@app.command()
def up(slurm: Optional[str] = SLURM_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Install what is missing and start every daemon that is not running (idempotent)."""
    from toolkit.sandbox import cluster

    data = cluster.up(_layout(slurm))
    if not as_json:
        if data["installed"]:
            info(f"installed: {' '.join(data['installed'])}")
        info(f"started: {' '.join(data['started'])}" if data["started"] else "already up")
    emit(data, as_json, _usage)


@app.command()
def down(slurm: Optional[str] = SLURM_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Stop the daemons this sandbox started (by their pid files)."""
    from toolkit.sandbox import cluster

    stopped = cluster.down(_layout(slurm))
    emit({"stopped": stopped}, as_json, f"stopped: {' '.join(stopped)}" if stopped else "nothing was running")


@app.command()
def status(slurm: Optional[str] = SLURM_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Which daemons run, and the nodes' Slurm states. Exit 1 when the sandbox is not fully up."""
    from toolkit.sandbox import cluster

    data = cluster.status(_layout(slurm))

    def human(d: dict) -> str:
        daemons = table([(x["name"], x["pid"] or "-", "running" if x["running"] else "stopped")
                         for x in d["daemons"]], ["daemon", "pid", "state"])
        nodes = table(sorted(d["nodes"].items()), ["node", "state"]) if d["nodes"] else "nodes: unknown"
        return f"{'up' if d['up'] else 'not up'}\n{daemons}\n\n{nodes}\n\n{_usage(d)}"

    emit(data, as_json, human)
    if not data["up"]:
        raise typer.Exit(1)
