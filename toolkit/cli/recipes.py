"""`hpc recipes`: Training recipes: list, show, validate, render and submit."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from toolkit.cli.output import JSON_OPTION, emit, hpc_program, info, table

app = typer.Typer(help="Training recipes: list, show, validate, render and submit.", no_args_is_help=True, rich_markup_mode=None)

NODES = typer.Option(None, "--nodes", "-N", min=1, help="Nodes (default: the recipe's resources.nodes).")
CLUSTER = typer.Option(None, "--cluster", help="A ParallelCluster v3 config (default: this cluster's own, else p3dn).")
QUEUE = typer.Option(None, "--queue", "-q", help="Queue of the cluster config (default: its first queue).")
PROFILE = typer.Option(None, "--profile", "-p", help="A named profile of the recipe (e.g. smoke).")
ACCOUNT = typer.Option(None, "--account", help="Slurm account (passed through).")
QOS = typer.Option(None, "--qos", help="Slurm QOS (passed through).")
RESERVATION = typer.Option(None, "--reservation", help="Slurm reservation (passed through).")
DEPENDENCY = typer.Option(None, "--dependency", help="Slurm dependency, e.g. afterok:123.")
SET = typer.Option([], "--set", help="Override a recipe value: KEY.PATH=VALUE (e.g. args.--lr=0.1); null removes.")
VERBOSE = typer.Option(False, "--verbose", help="With --dry-run: the scripts and submitit's parameters in full "
                                                "after the summary.")
RUN_DIR = typer.Option(None, "--run-dir", help="The job's run dir (default: a new one under $HPC_RUNS_DIR, else "
                                                 "~/hpc-runs, as submit makes it).")


def slurm_options(account, qos, reservation, dependency) -> dict[str, str | None]:
    """The Slurm options passed through to sbatch untouched (checked where they become #SBATCH lines)."""
    return {"account": account, "qos": qos, "reservation": reservation, "dependency": dependency}


def _spec(name: str, nodes, cluster, queue, profile, overrides, run_dir: Path | None, options=None):
    """The recipe and job spec a submit of the same arguments would plan (toolkit.submit.plan.plan_job)."""
    from toolkit.submit import plan as plans

    request = plans.SubmitRequest(name, nodes, str(cluster) if cluster else None, queue, profile, tuple(overrides),
                                  slurm_options=options or {})
    recipe, _, spec, _, notes = plans.plan_job(request, run_dir.absolute() if run_dir else None)
    for note in notes:
        info(note)
    _warn(spec.warnings)
    return recipe, spec


def _warn(warnings) -> None:
    for warning in warnings:
        info(f"warning: {warning}")


@app.command("list")
def list_(as_json: bool = JSON_OPTION) -> None:
    """List the recipes (recipes/*.yaml, $HPC_RECIPES_DIR first)."""
    from toolkit.recipes.load import list_recipe_files, load_recipe

    rows = []
    for path in list_recipe_files():
        recipe = load_recipe(path)
        rows.append({"name": recipe.name, "launcher": recipe.launcher.kind, "nodes": recipe.resources.nodes,
                     "profiles": list(recipe.profiles), "description": recipe.description, "path": str(path)})
    emit(rows, as_json, lambda rs: table(
        [[r["name"], r["launcher"], r["nodes"], ",".join(r["profiles"]) or "-", r["description"]] for r in rs],
        ["NAME", "LAUNCHER", "NODES", "PROFILES", "DESCRIPTION"]))


@app.command()
def show(name: str = typer.Argument(..., help="Recipe name or path to a recipe file."),
         nodes: Optional[int] = NODES, cluster: Optional[Path] = CLUSTER, queue: Optional[str] = QUEUE,
         profile: Optional[str] = PROFILE, overrides: list[str] = SET, run_dir: Optional[Path] = RUN_DIR,
         as_json: bool = JSON_OPTION) -> None:
    """Show a recipe and every value derived for a node count, with the rule behind it."""
    import dataclasses
    import shlex

    from toolkit.job.rank import preview_argv

    recipe, spec = _spec(name, nodes, cluster, queue, profile, overrides, run_dir)
    rank0 = preview_argv(spec.command)
    data = {"recipe": recipe.model_dump(mode="json", exclude={"profiles"}), "profiles": list(recipe.profiles),
            "job": {"partition": spec.partition, "instance_type": spec.instance_type, "nodes": spec.nodes,
                    "tasks_per_node": spec.tasks_per_node, "world_size": spec.world_size,
                    "cpus_per_task": spec.cpus_per_task, "time_limit": spec.time_limit, "run_dir": spec.run_dir},
            "derived": [dataclasses.asdict(d) for d in spec.derived],
            "env": [dataclasses.asdict(v) for v in spec.env], "rank0_argv": rank0, "warnings": list(spec.warnings)}

    def human(d: dict) -> str:
        lines = [f"{recipe.name}: {recipe.description}", f"source: {recipe.source}"]
        lines += [f"notes: {recipe.notes}"] if recipe.notes else []
        lines += [f"profiles: {', '.join(recipe.profiles) or '-'}",
                  f"job: {spec.nodes} x {spec.instance_type} (partition {spec.partition}), {spec.tasks_per_node} ranks "
                  f"per node, world size {spec.world_size}, time {spec.time_limit}", f"run dir: {spec.run_dir}", "",
                  "derived values:",
                  table([[x.key, x.value, x.rule] for x in spec.derived], ["VALUE OF", "IS", "BECAUSE"]), "",
                  "environment:"]
        lines += [f"  {v.name}={v.value}    # {v.doc}" for v in spec.env]
        lines += ["", "rank 0 runs:", "  " + shlex.join(rank0)]
        return "\n".join(lines)

    emit(data, as_json, human)


@app.command()
def validate(file: Path = typer.Argument(..., help="Recipe file."), as_json: bool = JSON_OPTION) -> None:
    """Validate a recipe file and each of its profiles (exit 1 with one line per fault)."""
    from toolkit.recipes.load import validate_recipe_file

    profiles = validate_recipe_file(file)
    emit({"ok": True, "file": str(file), "profiles": profiles}, as_json,
         f"{file}: ok" + (f" (profiles: {', '.join(profiles)})" if profiles else ""))


@app.command()
def new(name: str = typer.Argument(..., help="Recipe name ([a-z0-9_-]); the file is recipes/NAME.yaml."),
        script: Optional[str] = typer.Option(None, "--script", help="Your script (a .py path)."),
        module: Optional[str] = typer.Option(None, "--module", "-m", help="Or your module (pkg.train)."),
        script_args: Optional[list[str]] = typer.Argument(None, metavar="-- SCRIPT_ARGS...",
                                                          help="Arguments for the script, after `--`."),
        nodes: int = typer.Option(1, "--nodes", "-N", min=1, help="resources.nodes of the recipe."),
        launcher: str = typer.Option("script", "--launcher", help="script (srun per rank) or torchrun."),
        time: Optional[str] = typer.Option(None, "--time", "-t", help="resources.time (default 24:00:00)."),
        max_restarts: Optional[int] = typer.Option(None, "--max-restarts", min=0, help="torchrun restarts."),
        venv: Optional[Path] = typer.Option(None, "--venv", help="software.venv: the nodes' environment."),
        env: list[str] = typer.Option([], "--env", "-e", help="env.NAME: NAME=VALUE (repeatable)."),
        output: Optional[Path] = typer.Option(None, "--output", "-o", help="Default: recipes/NAME.yaml here."),
        force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
        as_json: bool = JSON_OPTION) -> None:
    """Write a recipe for your own script or module, from the same choices as `hpc run` (then edit the YAML)."""
    import yaml

    from toolkit.errors import HpcError, UsageError
    from toolkit.recipes.load import load_recipe
    from toolkit.recipes.user import parse_env, user_recipe

    if (script is None) == (module is None):
        raise UsageError("give exactly one of --script FILE.py and --module pkg.train",
                         fix="e.g. hpc recipes new mytrain --script train.py")
    target = script if script is not None else module
    if module is not None and module.endswith(".py"):
        raise UsageError(f"--module {module!r} is a file name", fix=f"use --script {module}")
    data = user_recipe(target, script_args or [], name=name, nodes=nodes, style=launcher, time=time,
                       max_restarts=max_restarts, venv=str(venv) if venv else None, env=parse_env(env))
    if script is not None and not Path(script).is_file():
        raise HpcError(f"script {script} does not exist", fix="give the path of an existing .py file")
    load_recipe(name, data=data)  # validated before anything is written
    path = output or Path("recipes") / f"{name}.yaml"
    if path.exists() and not force:
        raise HpcError(f"{path} exists", fix="pass --force to overwrite it, or choose another -o FILE")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# Written by `hpc recipes new {name}`: edit freely, check with `hpc recipes validate {path}`.\n"
                    + yaml.safe_dump(data, sort_keys=False))
    emit({"ok": True, "file": str(path), "recipe": data}, as_json,
         f"wrote {path} (submit it: hpc recipes submit {path})")


@app.command()
def render(name: str = typer.Argument(..., help="Recipe name or path to a recipe file."),
           nodes: Optional[int] = NODES, cluster: Optional[Path] = CLUSTER, queue: Optional[str] = QUEUE,
           profile: Optional[str] = PROFILE, overrides: list[str] = SET,
           account: Optional[str] = ACCOUNT, qos: Optional[str] = QOS, reservation: Optional[str] = RESERVATION,
           dependency: Optional[str] = DEPENDENCY, run_dir: Optional[Path] = RUN_DIR,
           output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the script here (default: stdout)."),
           force: bool = typer.Option(False, "--force", help="Overwrite an existing --output file."),
           as_json: bool = JSON_OPTION) -> None:
    """Render a recipe as an sbatch script for a queue and node count."""
    from toolkit.errors import HpcError
    from toolkit.job.render import render_script

    _, spec = _spec(name, nodes, cluster, queue, profile, overrides, run_dir,
                    slurm_options(account, qos, reservation, dependency))
    script = render_script(spec)
    if output is not None:
        if output.exists() and not force:
            raise HpcError(f"{output} exists", fix="pass --force to overwrite it, or choose another -o FILE")
        try:
            output.write_text(script)
        except OSError as exc:
            raise HpcError(f"cannot write {output}: {exc.strerror}",
                           fix="choose an -o FILE in an existing, writable directory") from None
        info(f"wrote {output}")
    if as_json:
        emit({"script": script, "output": str(output) if output else None, "job_name": spec.job_name,
              "run_dir": spec.run_dir, "warnings": list(spec.warnings)}, True)
    elif output is None:
        typer.echo(script, nl=False)


@app.command()
def submit(name: str = typer.Argument(..., help="Recipe name or path to a recipe file."),
           nodes: Optional[int] = NODES, cluster: Optional[Path] = CLUSTER, queue: Optional[str] = QUEUE,
           profile: Optional[str] = PROFILE, overrides: list[str] = SET,
           account: Optional[str] = ACCOUNT, qos: Optional[str] = QOS, reservation: Optional[str] = RESERVATION,
           dependency: Optional[str] = DEPENDENCY,
           executor: Optional[str] = typer.Option(None, "--executor",
                                                  help="slurm | local | sbatch (default: slurm; local only where no "
                                                       "Slurm is installed; sbatch sends the rendered script "
                                                       "itself, as MPI binaries always go)."),
           sweeps: list[str] = typer.Option([], "--sweep", help="Sweep a recipe value as one job array: "
                                             "KEY.PATH=V1,V2,... (A..B: integers; \\, a comma in a value); "
                                             "repeat for a grid."),
           array_parallelism: Optional[int] = typer.Option(None, "--array-parallelism", min=1,
                                                           help="With --sweep: at most this many tasks of each "
                                                                "array at once "
                                                                "(default: submitit's 256)."),
           dry_run: bool = typer.Option(False, "--dry-run", help="Print what would be submitted; submit nothing."),
           verbose: bool = VERBOSE,
           wait: bool = typer.Option(False, "--wait", help="Show progress until the job ends; exit 1 if it fails."),
           as_json: bool = JSON_OPTION) -> None:
    """Submit a recipe through submitit (srun starts one rank per GPU, or per declared CPU rank)."""
    from toolkit.errors import UsageError
    from toolkit.submit import plan as plans

    request = plans.SubmitRequest(name, nodes, str(cluster) if cluster else None, queue, profile, tuple(overrides),
                                  slurm_options(account, qos, reservation, dependency), executor)
    if sweeps:
        _submit_sweep(request, sweeps, array_parallelism, dry_run, wait, as_json, verbose)
        return
    if array_parallelism is not None:
        raise UsageError("--array-parallelism limits a sweep's job array", fix="add --sweep KEY.PATH=V1,V2,...")
    submit_request(request, dry_run, wait, as_json, verbose)


def submit_request(request, dry_run: bool, wait: bool, as_json: bool, verbose: bool = False) -> None:
    """Plan a request; print the plan (--dry-run) or execute it, and with --wait follow it (exit 1 unless it
    completes). `hpc recipes submit` and `hpc run` both end here."""
    from toolkit.slurm.status import State
    from toolkit.submit import plan as plans, submission

    _verbose_needs_dry_run(verbose, dry_run)
    if dry_run:
        from toolkit.submit import summary

        plan = plans.plan(request)
        for note in plan.notes:
            info(note)
        _warn(plan.warnings)
        emit(summary.dry_run_json(plan), as_json, lambda _d: summary.dry_run_text(plan, verbose))
        return
    result = submission.submit(request, progress=info)
    result["follow"] = f"{hpc_program()} jobs logs {result['job_id']} --follow"
    _warn(result["warnings"])
    info(f"submitted job {result['job_id']} ({result['nodes']} nodes, {result['ranks']} ranks) to queue "
         f"{result['queue']}\n  run dir: {result['run_dir']}\n  follow:  {result['follow']}")
    if wait:
        result.update(submission.wait(result["job_id"], Path(result["run_dir"]), progress=info))
        if result["state"] == State.COMPLETED:
            _print_outcome(result)
    emit(result, as_json, lambda r: f"{r['job_id']}" + (f" {r['state']}" if "state" in r else ""))
    if wait and result["state"] != State.COMPLETED:
        from toolkit.submit.runs import failure_reason

        log = result.get("failed_rank_log")
        reason = failure_reason(log) if log else None
        info(f"job {result['job_id']} ended {result['state']}" + (f": {reason}" if reason else "")
             + (f" (see {log})" if log else ""))
        raise typer.Exit(1)


def _verbose_needs_dry_run(verbose: bool, dry_run: bool) -> None:
    if verbose and not dry_run:
        from toolkit.errors import UsageError

        raise UsageError("--verbose shows a dry run in full; a submitted job's scripts are in its run dir",
                         fix="add --dry-run to see what would be submitted, or leave out --verbose")


def _submit_sweep(request, sweeps: list[str], parallelism, dry_run: bool, wait: bool, as_json: bool,
                  verbose: bool) -> None:
    from toolkit.slurm.status import State
    from toolkit.rundir import RunDir
    from toolkit.submit import runs, submission, summary, sweep

    _verbose_needs_dry_run(verbose, dry_run)
    plan = sweep.plan(request, sweeps, parallelism)
    for note in plan.tasks[0].notes:
        info(note)
    data = plan.to_json()
    _warn(data["warnings"])
    if dry_run:
        emit(summary.dry_run_json(plan), as_json, lambda _d: summary.dry_run_text(plan, verbose))
        return
    array_id = sweep.execute(plan)
    first = plan.tasks[0]
    meta = RunDir(plan.sweep_dir).read_metadata()
    arrays = runs.sweep_arrays(meta)
    result = {"job_id": array_id, "run_dir": str(plan.sweep_dir), "tasks": len(plan.tasks), "arrays": arrays,
              "executor": first.executor.value, "queue": first.queue.name, "nodes": first.spec.nodes,
              "ranks": first.spec.world_size, "warnings": data["warnings"],
              "follow": f"{hpc_program()} jobs status {array_id}"}
    info(f"submitted {summary.arrays_text(arrays)} {', '.join(a['job_id'] for a in arrays)} ({result['tasks']} "
         f"tasks of {result['nodes']} nodes, {result['ranks']} ranks) to queue {result['queue']}\n"
         f"  sweep dir: {result['run_dir']}\n"
         f"  follow:    {result['follow']}")
    if wait:
        result.update(submission.wait(array_id, plan.sweep_dir, progress=info))
        if result["state"] == State.COMPLETED:
            _print_outcome(result)
        else:
            result["failed_tasks"] = runs.sweep_failed_tasks(plan.sweep_dir, meta)
    emit(result, as_json, lambda r: f"{r['job_id']}" + (f" {r['state']}" if "state" in r else ""))
    if wait and result["state"] != State.COMPLETED:
        for task in result["failed_tasks"]:
            info(f"task {task['job_id']} ended {task['state']}" + (f": see {task['log']}" if task["log"] else ""))
        raise typer.Exit(1)


def _print_outcome(result: dict) -> None:
    """What the finished run did, from its logs (hpc report run has the full story); quiet if it has no log."""
    from toolkit.errors import HpcError
    from toolkit.reports.scaling import read_run

    try:
        training = read_run(result["run_dir"]).training
    except HpcError:
        return
    if not training:
        return
    curve = training["loss_curve"]
    loss = f", loss {curve[0][1]:.3f} -> {curve[-1][1]:.3f}" if len(curve) > 1 else ""
    rate = f", {training['throughput']:.1f} {training['unit']}" if training["throughput"] else ""
    info(f"result: {result['ranks']} ranks, {training['updates']} updates{loss}{rate} "
         f"(details: {hpc_program()} report run {result['run_dir']})")
