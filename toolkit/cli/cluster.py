"""`hpc cluster`: Generate, validate and inspect AWS ParallelCluster v3 configs."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from toolkit.cli.output import JSON_OPTION, emit, info, table

app = typer.Typer(help="Generate, validate and inspect AWS ParallelCluster v3 configs.", no_args_is_help=True, rich_markup_mode=None)

STATUS_ORDER = ("FAIL", "warn", "ok", "absent", "n/a")


def _doctor_text(data: dict) -> str:
    from toolkit.health.evaluate import CHECKS

    q = data["queue"]
    lines = [f"queue {q['name']}: {q['instance_type']}, {q['gpus_per_node']} GPUs, {q['efa_interfaces']} EFA, "
             f"efa-stack {q['efa_stack']}, FSx {q['fsx_mount'] or 'none'}", ""]
    rows = []
    for node in data["nodes"]:
        status = {c["name"]: c["status"] for c in node["checks"]}
        rows.append([node["node"], *(status.get(name, "-") for name in CHECKS)])
    lines.append(table(rows, ["NODE", *CHECKS]))
    # details once per distinct (check, status, detail), with the nodes that share it
    grouped: dict[tuple, list[str]] = {}
    for node in data["nodes"]:
        if node["error"]:
            grouped.setdefault(("node", "FAIL", node["error"], None), []).append(node["node"])
        for c in node["checks"]:
            grouped.setdefault((c["name"], c["status"], c["detail"], c["fix"]), []).append(node["node"])
    lines += ["", "details:"]
    for (name, status, detail, fix), nodes in sorted(grouped.items(), key=lambda kv: STATUS_ORDER.index(kv[0][1])):
        lines.append(f"  {status:6} {name}: {detail}  [{','.join(nodes)}]")
        if fix:
            lines.append(f"         fix: {fix}")
    if data["job_error"]:
        lines.append(f"srun: {data['job_error']}")
    lines += ["", "ok: every node passed" if data["ok"] else "FAILED: see the FAIL lines above"]
    return "\n".join(lines)


@app.command()
def doctor(
    queue: Optional[str] = typer.Option(None, "--queue", "-q", help="Queue (Slurm partition) to check (default: the config's first)."),
    nodes: Optional[int] = typer.Option(None, "--nodes", "-N", min=1, help="Check this many nodes (default: every node)."),
    cluster: Optional[Path] = typer.Option(None, "--cluster", help="The cluster's ParallelCluster v3 config (default: its own)."),
    timeout: float = typer.Option(600.0, "--timeout", min=1, help="Seconds to wait for the check job (nodes may power up)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Check every node of a queue: EFA, ib_uverbs, GPUs, FSx, NCCL, aws-ofi-nccl, EFA stack (exit 1 on a FAIL)."""
    from toolkit.cluster.queues import cluster_config_candidates, resolve_queue
    from toolkit.errors import HpcError
    from toolkit.health.doctor import run_doctor
    from toolkit.slurm.discovery import use_discovered_slurm

    use_discovered_slurm()
    if cluster is None and not any(p.is_file() for p in cluster_config_candidates()):
        raise HpcError("no cluster config given or found: the doctor checks nodes against what their queue declares",
                       fix="pass --cluster FILE (the cluster's ParallelCluster config) and --queue Q")
    chosen, how = resolve_queue(cluster, queue)
    info(f"queue: {how}")
    report = run_doctor(chosen, nodes, timeout)
    emit(report.as_dict(), as_json, _doctor_text)
    if not report.ok:
        raise typer.Exit(1)
