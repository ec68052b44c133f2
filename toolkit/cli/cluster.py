"""`hpc cluster`: Generate, validate and inspect AWS ParallelCluster v3 configs."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import List, Optional

import typer

from toolkit.cli import options as o
from toolkit.cli.output import JSON_OPTION, counted, emit, fail, info, output_target, plot_target, table, warn

app = typer.Typer(help="Generate, validate and inspect AWS ParallelCluster v3 configs.", no_args_is_help=True,
                  rich_markup_mode=None)

QUEUE_SPEC = "NAME=INSTANCE_TYPE:MAX_NODES[,...]"
QUEUE_SPEC_HELP = ("A queue to create: NAME=INSTANCE_TYPE:MAX_NODES, then optionally ,efa-stack=modern|legacy|none "
                   "and ,ranks-per-node=N (e.g. gpu=p4d.24xlarge:4). --queue names an existing queue elsewhere.")



@app.command("config")
def config(
    name: str = typer.Option(..., "--name", help="Cluster name (for pcluster create-cluster)."),
    region: str = typer.Option(..., "--region", help="AWS region, e.g. us-east-1."),
    subnet: Optional[str] = typer.Option(None, "--subnet", help="One subnet id for the head node and every queue: "
                                         "it must be private, with a NAT gateway (EFA nodes get several network "
                                         "interfaces, and AWS cannot give those a public IP)."),
    head_subnet: Optional[str] = typer.Option(None, "--head-subnet", help="Subnet id for the head node (may be "
                                              "public, for SSH); overrides --subnet."),
    compute_subnet: Optional[str] = typer.Option(None, "--compute-subnet", help="Subnet id for every queue: a "
                                                 "private subnet with a NAT gateway; overrides --subnet."),
    key_name: str = typer.Option(..., "--key-name", help="EC2 key pair name for SSH to the head node."),
    queue: List[str] = typer.Option(..., "--queue-spec", metavar=QUEUE_SPEC, help=QUEUE_SPEC_HELP + " Repeat for "
                                    "more queues."),
    head_node: str = typer.Option("c5n.18xlarge", "--head-node", metavar="INSTANCE_TYPE",
                                  help="Head node instance type."),
    os: o.Os = typer.Option(o.Os.ubuntu2204, "--os", help="Operating system (ParallelCluster 3.16 names)."),
    custom_ami: Optional[str] = typer.Option(None, "--custom-ami", help="AMI id for every node (needed for V100)."),
    fsx_import: Optional[str] = typer.Option(None, "--fsx-import", help="s3://bucket/prefix to link to /fsx."),
    fsx_capacity: Optional[int] = typer.Option(None, "--fsx-capacity", help="FSx size in GiB (1200 or n*2400)."),
    fsx_deployment: Optional[o.FsxDeployment] = typer.Option(None, "--fsx-deployment", help="FSx deployment type "
                                                             "(default SCRATCH_2)."),
    fsx_throughput: Optional[int] = typer.Option(None, "--fsx-throughput", help="MB/s the jobs read from /fsx "
                                                 "at once: the smallest FSx (and PERSISTENT_2 tier) whose "
                                                 "baseline reaches it."),
    ssh_allowed_ips: Optional[str] = typer.Option(None, "--ssh-allowed-ips", help="CIDR or prefix list (pl-...) "
                                                  "that may SSH to the head node (default 10.0.0.0/8: private "
                                                  "addresses only)."),
    capacity_reservation: Optional[str] = typer.Option(None, "--capacity-reservation",
                                                       help="[QUEUE=]cr-... targeted capacity reservation."),
    capacity_block: Optional[str] = typer.Option(None, "--capacity-block", help="[QUEUE=]cr-... Capacity Block "
                                                 "for ML: the queue runs its MAX_NODES for the block's duration."),
    post_install: Optional[str] = typer.Option(None, "--post-install", help="Script URL run on compute nodes."),
    pyxis: bool = typer.Option(False, "--pyxis", help="Enable pyxis + enroot (jobs with software.container, "
                                                      "hpc run --container) with AWS's custom actions, pinned to a "
                                                      "commit."),
    pyxis_script: Optional[str] = typer.Option(None, "--pyxis-script", metavar="S3_URL", help="Enable pyxis with "
                                               "your copy of the toolkit's script on S3 instead (written by `hpc "
                                               "cluster pyxis-script`); implies --pyxis."),
    output: str = typer.Option(..., "--output", "-o", metavar="FILE|DIR|-", help="File to write (a directory: "
                               "NAME.yaml in it; -: stdout)."),
    force: bool = o.FORCE,
    as_json: bool = JSON_OPTION,
) -> None:
    """Write a ParallelCluster v3 config (Slurm, EFA queues in placement groups, optional FSx for Lustre)."""
    from toolkit.cluster.build import SSH_ALLOWED_IPS, ClusterSpec, FsxSpec, config_text, parse_queue, write_config
    from toolkit.errors import UsageError

    head, compute = head_subnet or subnet, compute_subnet or subnet
    if not (head and compute):
        raise UsageError("no subnet for the " + ("head node" if not head else "queues"),
                         fix="give --head-subnet (head node) and --compute-subnet (a private subnet with NAT for "
                         "the queues), or --subnet for both")

    fsx = None
    if fsx_import or fsx_capacity or fsx_deployment or fsx_throughput is not None:
        fsx = FsxSpec(deployment="PERSISTENT_2" if fsx_deployment is o.FsxDeployment.PERSISTENT_2 else "SCRATCH_2",
                      capacity_gib=fsx_capacity or 1200,
                      import_path=fsx_import, throughput_mbs=fsx_throughput)
    reservation_queue, _, reservation = (capacity_reservation or "").rpartition("=")
    block_queue, _, block = (capacity_block or "").rpartition("=")
    spec = ClusterSpec(
        name=name, region=region, head_subnet=head, compute_subnet=compute, key_name=key_name,
        queues=tuple(parse_queue(q) for q in queue), head_node=head_node, os=os.value, custom_ami=custom_ami, fsx=fsx,
        capacity_reservation=reservation or None, reservation_queue=reservation_queue or None,
        capacity_block=block or None, capacity_block_queue=block_queue or None, post_install=post_install,
        ssh_allowed_ips=ssh_allowed_ips or SSH_ALLOWED_IPS, pyxis=pyxis, pyxis_script=pyxis_script)
    path = output_target(output, f"{name}.yaml")
    if path is None:  # -o -: the config on stdout (with --json, in the envelope's data)
        text, warnings = config_text(spec, "-")
        if not as_json:
            typer.echo(text, nl=False)
    else:
        text, warnings = None, write_config(spec, path, force=force)
    for message in warnings:
        warn(message)
    emit({"file": str(path) if path else None, "text": text, "warnings": warnings}, as_json,
         f"wrote {path}" if path else None)


@app.command("pyxis-script")
def pyxis_script(
    output: str = typer.Option(..., "--output", "-o", metavar="FILE|DIR|-", help="File to write (a directory: "
                               "enable-pyxis.sh in it; -: stdout)."),
    force: bool = o.FORCE,
    as_json: bool = JSON_OPTION,
) -> None:
    """Write the script that turns pyxis on, to upload to your S3 bucket for `hpc cluster config --pyxis-script`."""
    from toolkit.cli.output import write_output
    from toolkit.cluster.build import PYXIS_SCRIPT_NAME, pyxis_script_text

    text = pyxis_script_text()
    path = output_target(output, PYXIS_SCRIPT_NAME)
    if path is None:
        if not as_json:
            typer.echo(text, nl=False)
    else:
        write_output(path, text, force)
        path.chmod(0o755)
    upload = f"aws s3 cp {shlex.quote(str(path or PYXIS_SCRIPT_NAME))} s3://BUCKET/KEY"
    emit({"file": str(path) if path else None, "text": text, "upload": upload}, as_json,
         f"wrote {path}\nnext: {upload}, then hpc cluster config ... --pyxis-script s3://BUCKET/KEY" if path else None)


def _validation_text(report: dict) -> str:
    findings = report["findings"]
    judge = f" by ParallelCluster {report['parallelcluster']}'s rules" if report["parallelcluster"] else ""
    lines = [f"{report['file']}: {'valid' if report['valid'] else 'INVALID'}{judge} ({counted(findings)})"]
    for f in findings:
        where = f"{f['file']}:{f['line']}" if f["line"] else f["file"]
        lines.append(f"{f['level']:<8}{where}  {f['path'] or '(file)'}")
        lines.append(f"        {f['message']}")
        if f["fix"]:
            lines.append(f"        fix: {f['fix']}")
    if report["not_checked_offline"]:
        lines.append("not checked offline (AWS look-ups that `pcluster create-cluster` makes, facts the file does not "
                     "hold, validators that failed to run):")
        lines += [f"  {name}: {what}" for name, what in report["not_checked_offline"].items()]
    return "\n".join(lines)


@app.command("validate")
def validate(
    file: str = typer.Argument(..., help="ParallelCluster v3 config file."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Check a config offline: pcluster's own schema and validators, plus the toolkit's checks."""
    from toolkit.cluster.validate import validate_file

    report = validate_file(file).as_dict()
    emit(report, as_json, _validation_text)
    if not report["valid"]:
        raise fail(f"{file} is not a valid cluster config")


@app.command("show")
def show(
    file: Optional[str] = typer.Argument(None, help="Cluster config (default: $HPC_CLUSTER_CONFIG, else this "
                                                    "cluster's own: /opt/parallelcluster/shared/cluster-config.yaml)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """The queues a researcher can pick: instance type, GPUs per node, EFA, max nodes, FSx mount."""
    from toolkit.catalog import facts_hint
    from toolkit.cluster.queues import queue_summaries, this_cluster_config

    path = file or this_cluster_config()
    rows = queue_summaries(path)

    def facts(r: dict) -> list:
        if not r["known"]:
            return ["unknown"] * 3
        return [f"{r['gpus_per_node']} x {r['gpu_model']}" if r["gpus_per_node"] else "0",
                f"{r['cpus_per_node']}{' (SMT off)' if r['smt_off'] else ''}", r["efa_interfaces"]]
    emit(rows, as_json, lambda rs: table(
        [[r["queue"], r["compute_resource"], r["instance_type"], *facts(r), f"{r['min_nodes']}-{r['max_nodes']}",
          r["fsx_mount"] or "-"] for r in rs],
        ["QUEUE", "COMPUTE RESOURCE", "INSTANCE TYPE", "GPUS/NODE", "CPUS/NODE", "EFA", "NODES", "FSX"]))
    if not as_json and any(not r["known"] for r in rows):
        info(f"unknown: instance types outside the toolkit's catalog; {facts_hint()}")
    if not as_json and file is None:
        info(f"(from {path})")


STATUS_ORDER = ("FAIL", "warn", "ok", "absent", "n/a")


def _doctor_text(data: dict) -> str:
    from toolkit.node.evaluate import CHECKS

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
    lines.append(f"Slurm {data['slurm']['version']}: "
                 + ("has what our rendered jobs use" if not data["slurm"]["missing"] else "lacks what our jobs use"))
    lines += [f"  FAIL   slurm: {m}" for m in data["slurm"]["missing"]]
    if containers := data.get("containers"):
        lines.append(_containers_text(containers))
        versions: dict[str, list[str]] = {}
        for node in data["nodes"]:
            enroot = (node["facts"] or {}).get("enroot") or {}
            found = enroot.get("version") or "not on the job's PATH, /usr/bin or /usr/local/bin"
            versions.setdefault(found, []).append(node["node"])
        lines.append("enroot: " + "; ".join(f"{v} [{','.join(n)}]" for v, n in versions.items()))
    lines += ["", "ok: every node passed" if data["ok"] else "FAILED: see the FAIL lines above"]
    return "\n".join(lines)


def _containers_text(c: dict) -> str:
    pyxis = "pyxis loaded (srun --container-image)" if c["pyxis"] else "no pyxis: jobs with a container are refused"
    if not c["image"]:
        return f"containers: {pyxis}"
    where = f"started on {', '.join(c['started'])}" if c["started"] else "started nowhere"
    return f"containers: {pyxis}; {c['image']} {where}" + (f"\n  FAIL   containers: {c['error']}" if c["error"] else "")


def _loader_text(reports: list[dict]) -> str:
    lines = []
    for r in reports:
        lines.append(f"job {r['job']} (queue {r['queue']}) on {r['node'] or '?'}: "
                     f"LD_LIBRARY_PATH={r['ld_library_path'] or '(unset)'}")
        if r["error"]:
            lines.append(f"  FAIL   the check did not run: {r['error']}")
        lines.append(table([[c["library"], c["status"], c["path"] or c["detail"] or "-", c["wanted_by"]]
                            for c in r["libraries"]], ["LIBRARY", "LOADER", "FILE OR ERROR", "ASKED BY"]))
        for c in r["libraries"]:
            if c["fix"]:
                lines += [f"  {c['library']} does not resolve: {c['detail']}", f"    fix: {c['fix']}"]
        lines.append("")
    failed = [r["job"] for r in reports if not r["ok"]]
    lines.append("ok: every library resolves in its job's environment" if not failed else
                 f"FAILED: {', '.join(failed)} would not load what it needs")
    return "\n".join(lines)


def _doctor_jobs(recipes: list[str], cluster, queue, profile, overrides, timeout: float, as_json: bool) -> None:
    """The loader check of each job a submit of these arguments would plan, on a node of its queue."""
    from toolkit.health.loader import check_job_on_slurm
    from toolkit.submit import plan as plans

    reports = []
    for name in recipes:
        # One node: the environment a rank loads with does not depend on the node count, and a recipe's default
        # count may exceed the queue (resnet50's 8 on a 2-node queue).
        request = plans.SubmitRequest(name, 1, str(cluster) if cluster else None, queue, profile, tuple(overrides))
        _, chosen, spec, _, _ = plans.plan_job(request)
        reports.append(check_job_on_slurm(spec, chosen.fabric, timeout).as_dict())
    emit(reports, as_json, _loader_text)
    if not all(r["ok"] for r in reports):
        raise fail(f"{', '.join(r['job'] for r in reports if not r['ok'])} would not load what it needs")


@app.command()
def doctor(
    queue: Optional[str] = o.QUEUE,
    nodes: Optional[int] = typer.Option(None, "--check-nodes", min=1, help="Check this many of the queue's nodes "
                                        "(default: every node)."),
    cluster: Optional[Path] = o.CLUSTER,
    timeout: float = typer.Option(600.0, "--timeout", min=1,
                                  help="Seconds to wait for the check job (nodes may power up)."),
    recipe: List[str] = typer.Option([], "--recipe", metavar="RECIPE",
                                     help="Instead of the node checks: whether the dynamic loader resolves what this "
                                     "recipe's job loads (libnccl, the NCCL net plugin, libmpi, the HCCL OFI wrapper) "
                                     "in the job's own environment, on one node of the queue. Repeat for more jobs."),
    profile: Optional[str] = o.PROFILE,
    overrides: List[str] = o.SET,
    container_image: Optional[str] = typer.Option(None, "--container-image", help="Also start this container "
                                                  "image (.sqsh or reference) on every node through pyxis/enroot."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Check every node of a queue: EFA, ib_uverbs, GPUs, FSx, NCCL, aws-ofi-nccl, EFA stack (exit 1 on a FAIL);
    with --recipe, whether each job's libraries resolve in its own environment (exit 1 when one does not)."""
    from toolkit.cluster.queues import cluster_config_candidates, resolve_queue
    from toolkit.errors import HpcError, UsageError
    from toolkit.health.doctor import run_doctor
    if cluster is None and not any(p.is_file() for p in cluster_config_candidates()):
        raise HpcError("no cluster config given or found: the doctor checks nodes against what their queue declares",
                       fix="pass --cluster FILE (the cluster's ParallelCluster config) and --queue Q")
    if recipe:
        if nodes is not None:
            raise UsageError("--check-nodes is for the node checks; a job's loader check runs on one node",
                             fix="drop --check-nodes, or drop --recipe")
        _doctor_jobs(recipe, cluster, queue, profile, overrides, timeout, as_json)
        return
    if profile or overrides:
        raise UsageError("--profile and --set go with --recipe", fix="add --recipe NAME")
    if container_image:  # refused here as a job's --container is, not after a step on every node
        from toolkit.recipes.user import container_spec
        container_spec(container_image, image_option="--container-image")
    chosen, how = resolve_queue(cluster, queue)
    info(f"queue: {how}")
    report = run_doctor(chosen, nodes, timeout, container_image)
    emit(report.as_dict(), as_json, _doctor_text)
    if not report.ok:
        raise fail(f"a node of queue {chosen.name} failed a check")


def _bad_nodes_text(data: dict) -> str:
    rows = [(r["node"], f"{r['busbw']:.3g}" if r["busbw"] is not None else "-", r["verdict"],
             f"{','.join(r['group'])} (round {r['round']})", r.get("error") or "") for r in data["per_node"]]
    lines = [table(rows, ("node", "busbw GB/s", "verdict", "last group", "error"))]
    lines.append(f"{len(data['rounds'])} round(s) for {len(data['nodes'])} nodes (goal <= {data['goal_rounds']}; "
                 f"all pairs: {data['all_pairs']} runs)")
    for node, state in data["skipped"].items():
        lines.append(f"not tested: {node} ({state})")
    if data["unresolved"]:
        lines.append(f"unresolved (no healthy node left to pair with): {', '.join(data['unresolved'])}")
    software = data.get("software") or {}
    for node in sorted(software):
        lines.append(f"software: {software[node]}")
    if software:
        lines.append(f"fix: {data['software_fix']} (not drained: the nodes' software, not their hardware)")
    if data["drain_plan"]:
        lines.append(("drained:" if data["applied"] else "drain plan (run with --apply, as root or a Slurm operator):"))
        lines += [f"  {command}" for command in data["drain_plan"]]
    elif not software:
        lines.append("no slow or failing node found")
    return "\n".join(lines)


@app.command("find-bad-nodes")
def find_bad_nodes(
    queue: Optional[str] = typer.Option(None, "--queue", "-p", metavar="QUEUE", help="The Slurm partition to test "
                                        "(default: every node Slurm has, or those of --nodelist)."),
    nodelist: Optional[str] = typer.Option(None, "--nodelist", "-w", metavar="HOSTLIST", help="Only these nodes, as "
                                           "sbatch -w takes them (e.g. queue1-st-p5-[1-16])."),
    group_size: int = typer.Option(2, "--group-size", min=2, help="Nodes per group in the first round (2: pairs; "
                                   "half the nodes or more: plain bisection)."),
    threshold: float = typer.Option(0.5, "--threshold", min=0.05, max=0.95, metavar="FRACTION",
                                    help="A group is slow below (1 - this) x the round's best bus bandwidth."),
    min_busbw: Optional[float] = typer.Option(None, "--min-busbw", metavar="GB/S", help="Also slow below this bus "
                                              "bandwidth (a cluster slow everywhere looks healthy otherwise)."),
    size: str = typer.Option("64M", "--size", help="The all_reduce's message size (nccl-tests' syntax: 1M, 64M)."),
    iters: int = typer.Option(20, "--iters", min=1, help="Timed iterations per group."),
    concurrency: int = typer.Option(0, "--concurrency", min=0, help="Group runs at a time (0: all of a round at "
                                    "once; 1 where nodes share hardware, e.g. simulated nodes)."),
    timeout: float = typer.Option(1800.0, "--timeout", min=1, help="Seconds to wait for the search job's answer."),
    venv: Optional[Path] = typer.Option(None, "--venv", metavar="PATH", help="The venv whose python runs the "
                                        "ranks on the nodes (it needs torch and this toolkit; a path every node "
                                        "sees). Default: the collectives recipe's software (under the queue's FSx)."),
    cluster: Optional[Path] = o.CLUSTER,
    plot: Optional[Path] = typer.Option(None, "--plot", metavar="FILE.png", help="Per-node bus bandwidth as a PNG."),
    apply: bool = typer.Option(False, "--apply", help="Drain the bad nodes (scontrol update ... State=DRAIN)."),
    force: bool = o.FORCE,
    as_json: bool = JSON_OPTION,
) -> None:
    """Find the slow or failing nodes with short all_reduce runs over groups of nodes, splitting the slow groups
    (at most ceil(log2 N) + 2 rounds, not all pairs); print a table and a drain plan, applied with --apply
    (exit 1 when a node is bad, or its torch or NCCL does not load). Each group runs as a collectives job of the
    queue would: one rank per accelerator of each node, in the job's software and EFA/NCCL environment."""
    import math

    from toolkit.cluster.queues import cluster_config_candidates, resolve_queue
    from toolkit.errors import HpcError
    from toolkit.health import nodesearch
    from toolkit.rundir import run_dir_path

    plot_target(plot, force)  # before the search's jobs, not after them
    if cluster is None and not any(p.is_file() for p in cluster_config_candidates()):
        raise HpcError("no cluster config given or found: the search runs its collectives as the queue's jobs do "
                       "(GPUs per node, EFA), which the config declares",
                       fix="pass --cluster FILE (the cluster's ParallelCluster config) and --queue Q")
    chosen, how = resolve_queue(cluster, queue)
    info(f"queue: {how}")
    from toolkit.health import fleet
    from toolkit.node import ledger

    where = fleet.fleet_dir(chosen)
    if min_busbw is None and where is not None:  # the fleet's own baseline for a group's shape, where it has one
        from toolkit.job.scaling import parse_size
        from toolkit.reports.baseline import learn

        base = learn(ledger.read(where), chosen.instance_type, group_size, "all_reduce", parse_size(size.upper()))
        if base is not None and base.enough:
            min_busbw = round(base.bound_gbs, 3)
            info(f"--min-busbw {min_busbw:g}: {base.describe()}")
        else:
            info("no --min-busbw: the fleet has no baseline for this shape yet (runs compare with each other only)")
    options = ["--group-size", str(group_size), "--threshold", str(threshold), "--size", size, "--iters", str(iters),
               "--concurrency", str(concurrency)]
    options += ["--min-busbw", str(min_busbw)] if min_busbw is not None else []
    job = nodesearch.submit(chosen, queue, nodelist, run_dir_path("find-bad-nodes"), options,
                            str(venv) if venv else None)
    info(f"search job {job.job_id} on {len(job.nodes)} node(s); run dir {job.run_dir}")
    result = nodesearch.wait(job, info, timeout)
    plan = nodesearch.drain_commands(result["bad"])
    data = {**result, "software": result.get("software", {}), "software_fix": nodesearch.SOFTWARE_FIX,
            "job_id": job.job_id, "run_dir": str(job.run_dir), "skipped": job.skipped,
            "per_node": nodesearch.node_rows(result), "goal_rounds": nodesearch.max_rounds(len(job.nodes)),
            "all_pairs": math.comb(len(job.nodes), 2), "drain_plan": [shlex.join(c) for c in plan], "applied": False}
    if where is not None:  # every verdict into the fleet's ledger: a node at full speed clears its strikes
        data["recorded"] = ledger.write(where, fleet.search_records(data["per_node"], result["bad"], job.job_id))
    if plot is not None:
        from toolkit.reports.plots import nodes_figure, save_png

        data["plot"] = str(save_png(nodes_figure(data["per_node"]), plot))
    if apply and plan:
        from toolkit.slurm.commands import run

        for command in plan:
            run(command)
        data["applied"] = True
    emit(data, as_json, _bad_nodes_text)
    problems = [f"bad node(s): {', '.join(sorted(result['bad']) + result['unresolved'])}"] if (
        result["bad"] or result["unresolved"]) else []
    if data["software"]:
        first, *others = [data["software"][n] for n in sorted(data["software"])]
        problems.append(first + (f" (and {len(others)} more node(s))" if others else ""))
    if problems:
        raise fail("; ".join(problems))


def _nodes_text(data: dict) -> str:
    import datetime

    def when(t: float | None) -> str:
        return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M") if t else "-"

    rows = [(n["node"], n["healthy_runs"], n["strikes"], "SUSPECT" if n["suspect"] else "ok", when(n["last_seen"]),
             n["slurm_state"], (n["evidence"][-1]["evidence"] if n["evidence"] else "")[:70]) for n in data["nodes"]]
    policy = data["policy"]
    lines = [f"fleet ledger: {data['fleet_dir']}; policy: {policy['strikes']} strike(s) of "
             f"{'/'.join(policy['kinds'])} within {policy['window_hours']:g} h",
             table(rows, ("node", "healthy runs", "strikes", "verdict", "last seen", "slurm", "last evidence"))
             if rows else "no node recorded yet"]
    for node in data.get("cleared", []):
        lines.append(f"cleared: {node}")
    if data.get("plot"):
        lines.append(f"plot: {data['plot']}")
    if data["drain_plan"]:
        lines.append("drained:" if data["applied"] else "drain plan (run with --apply, as root or a Slurm operator):")
        lines += [f"  {command}" for command in data["drain_plan"]]
    return "\n".join(lines)


@app.command("nodes")
def nodes(
    cluster: Optional[Path] = o.CLUSTER,
    clear: List[str] = typer.Option([], "--clear", metavar="NODE", help="Record NODE as repaired: its strikes no "
                                    "longer count (repeatable)."),
    plot: Optional[Path] = typer.Option(None, "--plot", metavar="FILE.png", help="Passes and strikes over time, "
                                        "per node, as a PNG."),
    apply: bool = typer.Option(False, "--apply", help="Drain the nodes the quarantine policy names (scontrol "
                               "update ... State=DRAIN, the evidence as the reason)."),
    force: bool = o.FORCE,
    as_json: bool = JSON_OPTION,
) -> None:
    """Each node's record in the fleet's ledger (healthy runs, strikes, last seen, Slurm state) and the nodes the
    quarantine policy suspects, with their drain plan (applied with --apply). Exit 1 when a node is suspected."""
    from toolkit.health import fleet
    from toolkit.node import ledger

    plot_target(plot, force)
    if cluster is not None:
        from toolkit.cluster.queues import load_queues

        where = fleet.fleet_dir(next(iter(load_queues(cluster).values()), None))
    else:
        where = fleet.fleet_dir()
    if clear and where is not None:
        ledger.write(where, [fleet.clear_record(node) for node in clear])
    data = fleet.nodes_report(where)
    data["cleared"] = list(clear)
    if plot is not None:
        from toolkit.reports.plots import fleet_figure, save_png

        data["plot"] = str(save_png(fleet_figure(ledger.read(where) if where else [], list(data["suspects"])), plot))
    if apply and data["suspects"]:
        from toolkit.slurm.commands import run

        for command in fleet.drain_plan(data["suspects"]):
            run(command)
        data["applied"] = True
    emit(data, as_json, _nodes_text)
    if data["suspects"] and not data["applied"]:
        raise fail(f"suspected node(s): {', '.join(sorted(data['suspects']))}")


queue_app = typer.Typer(help="Add, change or remove queues of a cluster config in place (comments and layout "
                        "kept; the result is validated before the file is replaced).", no_args_is_help=True,
                        rich_markup_mode=None)
app.add_typer(queue_app, name="queue")
DRY_RUN_OPTION = typer.Option(False, "--dry-run", help="Print the diff of the file; change nothing.")


def _edit_output(result, as_json: bool) -> None:
    for message in result.warnings:
        warn(message)

    def text(data: dict) -> str:
        lines = [data["diff"].rstrip("\n")] if data["diff"] and not data["written"] else []
        lines += [f"{data['file']}: {change}" for change in data["changes"]]
        lines += [f"{data['file']}: {note}" for note in data["notes"]]
        if not data["changes"]:
            return "\n".join(lines)
        checked = ("validated offline" if not data["errors_before"] else
                   f"validated offline: the edit adds no error (the {data['errors_before']} the file had remain)")
        lines.append(f"{checked}; " + ("file updated" if data["written"] else "dry run: file not changed"))
        lines.append(f"next: `hpc cluster diff OLD {data['file']}` shows what `pcluster update-cluster` would say")
        return "\n".join(lines)
    emit(result.as_dict(), as_json, text)


@queue_app.command("add")
def queue_add(
    file: str = typer.Argument(..., help="ParallelCluster v3 config file to edit."),
    queue: str = typer.Option(..., "--queue-spec", metavar=QUEUE_SPEC, help=QUEUE_SPEC_HELP),
    capacity_block: Optional[str] = typer.Option(None, "--capacity-block", help="cr-... reservation id of a "
                                                 "Capacity Block for ML (MinCount = MaxCount, no placement group)."),
    min_nodes: Optional[int] = typer.Option(None, "--min", min=0, help="MinCount (default 0; MAX with "
                                            "--capacity-block)."),
    subnet: Optional[str] = typer.Option(None, "--subnet", help="Subnet id for the queue (default: the first "
                                         "queue's); an EFA queue needs a private one, with a NAT gateway."),
    dry_run: bool = DRY_RUN_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Add a queue after the last one (subnets from the first queue unless --subnet; EFA and placement group from
    the catalog)."""
    from toolkit.cluster.edit import add_queue

    _edit_output(add_queue(file, queue, min_nodes, capacity_block, dry_run, subnet), as_json)


@queue_app.command("set")
def queue_set(
    file: str = typer.Argument(..., help="ParallelCluster v3 config file to edit."),
    name: str = typer.Argument(..., help="Queue name."),
    max_nodes: Optional[int] = typer.Option(None, "--max", min=0, help="New MaxCount."),
    min_nodes: Optional[int] = typer.Option(None, "--min", min=0, help="New MinCount."),
    instance: Optional[str] = typer.Option(None, "--instance", metavar="INSTANCE_TYPE", help="New instance type."),
    compute_resource: Optional[str] = typer.Option(None, "--compute-resource", help="Which compute resource "
                                                   "(needed when the queue has several)."),
    subnet: Optional[str] = typer.Option(None, "--subnet", help="New subnet id for the queue; an EFA queue needs "
                                         "a private one, with a NAT gateway."),
    dry_run: bool = DRY_RUN_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Change a queue's node counts, instance type or subnet in place (no change: exit 0, file untouched)."""
    from toolkit.cluster.edit import set_queue

    _edit_output(set_queue(file, name, max_nodes, min_nodes, instance, compute_resource, dry_run, subnet), as_json)


@queue_app.command("remove")
def queue_remove(
    file: str = typer.Argument(..., help="ParallelCluster v3 config file to edit."),
    name: str = typer.Argument(..., help="Queue name."),
    dry_run: bool = DRY_RUN_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Remove a queue (and the comments that introduce it)."""
    from toolkit.cluster.edit import remove_queue

    _edit_output(remove_queue(file, name, dry_run), as_json)


def _short(value) -> str:
    """A value for the table: added or removed sections by their name (--json has them whole)."""
    if value is None:
        return "-"
    if isinstance(value, dict):
        name = value.get("Name") or value.get("Key")
        return f"{{Name: {name}, ...}}" if name else "{...}"
    return "[...]" if isinstance(value, list) else str(value)


def _plan_text(plan: dict) -> str:
    declared = plan["declared"]
    lines = [f"{plan['old_file']} -> {plan['new_file']} (declared: compute fleet {declared['fleet']}, login nodes "
             f"{declared['login_nodes']}, head node {declared['head_node']})"]
    if not plan["changes"]:
        return "\n".join(lines + [f"note: {note}" for note in plan["notes"]]
                         + ["no changes: nothing for update-cluster to do"])
    lines.append(table([[c["path"], _short(c["old"]), _short(c["new"]), c["policy"],
                         "yes" if c["accepted_now"] else c["check"]] for c in plan["changes"]],
                       ["KEY PATH", "OLD", "NEW", "UPDATE POLICY", "ACCEPTED NOW"]))
    for c in plan["changes"]:
        if not c["accepted_now"]:
            lines += [f"{c['check']:<14}{c['path']}: {c['reason']}", f"{'':<14}action: {c['action']}"]
    lines += [f"note: {note}" for note in plan["notes"]]
    lines.append("pcluster update-cluster would accept this update now" if plan["appliable"] else
                 "pcluster update-cluster would refuse this update as declared: see the actions above")
    return "\n".join(lines)


@app.command("diff")
def diff(
    old: str = typer.Argument(..., help="The config the cluster runs with now."),
    new: str = typer.Argument(..., help="The config to update it to."),
    fleet: o.State = typer.Option(o.State.running, "--fleet", help="Compute fleet state."),
    login_nodes: Optional[o.State] = typer.Option(None, "--login-nodes", help="Login nodes' state (default: "
                                                  "running when OLD has login node pools)."),
    head_node: o.State = typer.Option(o.State.running, "--head-node-state", help="Head node state."),
    as_json: bool = JSON_OPTION,
) -> None:
    """What `pcluster update-cluster` would say: every change, its update policy, and what to do (exit 1 when it
    cannot be applied as declared). Offline, with ParallelCluster's own update rules."""
    from toolkit.cluster.diff import plan_update

    plan = plan_update(old, new, fleet.value, o.value(login_nodes), head_node.value).as_dict()
    emit(plan, as_json, _plan_text)
    if not plan["appliable"]:
        raise fail("pcluster update-cluster would refuse this update as declared")


@app.command("topology")
def topology(
    ec2_json: str = typer.Argument(..., metavar="EC2_JSON", help="What `aws ec2 describe-instance-topology` printed "
                                   "for the queue's instances (saved unchanged)."),
    queue: str = typer.Option(..., "--queue", help="The queue (Slurm partition) the file is for."),
    nodes_map: str = typer.Option(..., "--nodes-map", metavar="FILE", help="`instance-id node-name` per line "
                                  "(space or comma): which Slurm node each instance is (docs/admins.md)."),
    form: str = typer.Option("tree", "--form", metavar="tree|block", help="topology/tree (any Slurm) or "
                             "topology/block (Slurm >= 23.11)."),
    output: Optional[str] = typer.Option(None, "--output", "-o", metavar="FILE|DIR|-", help="File to write (a "
                                         "directory: topology.conf in it; default: stdout)."),
    force: bool = o.FORCE,
    as_json: bool = JSON_OPTION,
) -> None:
    """Write Slurm's topology.conf for a queue from EC2's instance topology, and the order its ranks take."""
    from toolkit.cli.output import write_output
    from toolkit.cluster.topology import check_form, read_queue_topology, topology_text

    chosen = check_form(form, _local_slurm_version())
    topo = read_queue_topology(ec2_json, nodes_map, queue)
    text = topology_text(topo, chosen, Path(ec2_json).name)
    path = output_target(output, "topology.conf")
    if path is None and not as_json:
        typer.echo(text, nl=False)
    elif path is not None:
        write_output(path, text, force)
    plugin = f"topology/{chosen}"
    data = {**topo.as_dict(), "form": chosen, "plugin": plugin, "file": str(path) if path else None, "text": text}
    emit(data, as_json, f"wrote {path} ({len(topo.placements)} nodes of queue {queue}, {plugin})\n"
                        f"next: put it beside slurm.conf (/opt/slurm/etc on ParallelCluster) and set "
                        f"TopologyPlugin: {plugin} in Scheduling/SlurmSettings/CustomSlurmSettings "
                        f"(pcluster update-cluster; a new file later: `scontrol reconfigure`); "
                        f"tag queue {queue} `hpc:topology: {path}` so its jobs order ranks by it" if path else None)
    for left in topo.left_out:
        info(f"left out (not queue {queue}): {left}")


def _local_slurm_version() -> tuple[int, int] | None:
    """This machine's Slurm (the admin runs this on the head node), or None where none answers."""
    from toolkit.errors import HpcError
    from toolkit.slurm import version
    from toolkit.slurm.commands import slurm_installed

    if not slurm_installed():
        return None
    try:
        found = version.detect()
    except HpcError:
        return None
    return found.major, found.minor
