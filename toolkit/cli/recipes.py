"""`hpc recipes`: Training recipes: list, show, validate, render and submit."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

import typer

from toolkit.cli import options as o
from toolkit.cli.options import JobOptions
from toolkit.cli.output import JSON_OPTION, emit, fail, hpc_program, info, output_target, table, warn, write_output

app = typer.Typer(help="Training recipes: list, show, validate, render and submit.", no_args_is_help=True,
                  rich_markup_mode=None)

RUN_DIR = typer.Option(None, "--run-dir", help="The job's run dir (default: a new one under $HPC_RUNS_DIR, else "
                                                 "the cluster config's FSx (<mount>/hpc-runs/$USER), else "
                                                 "~/hpc-runs, as submit makes it).")


def _spec(name: str, nodes, cluster, queue, job: JobOptions, run_dir: Path | None):
    """The recipe and job spec a submit of the same arguments would plan (toolkit.submit.plan.plan_job)."""
    from toolkit.submit import plan as plans

    request = plans.SubmitRequest(name, nodes, str(cluster) if cluster else None, queue, job.profile,
                                  job.recipe_overrides(), slurm_options=job.slurm_options())
    recipe, _, spec, _, notes = plans.plan_job(request, run_dir.absolute() if run_dir else None)
    for note in notes:
        info(note)
    _warn(spec.warnings)
    return recipe, spec


def _warn(warnings) -> None:
    for warning in warnings:
        warn(warning)


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
def show(name: str = o.RECIPE, nodes: Optional[int] = o.NODES, cluster: Optional[Path] = o.CLUSTER,
         queue: Optional[str] = o.QUEUE, profile: Optional[str] = o.PROFILE, overrides: list[str] = o.SET,
         time: Optional[str] = o.TIME, env: list[str] = o.ENV, venv: Optional[Path] = o.VENV,
         run_dir: Optional[Path] = RUN_DIR, as_json: bool = JSON_OPTION) -> None:
    """Show a recipe and every value derived for a node count, with the rule behind it."""
    import dataclasses
    import shlex

    from toolkit.job.rank import preview_argv

    job = JobOptions(overrides, profile=profile, time=time, env=env, venv=venv)
    recipe, spec = _spec(name, nodes, cluster, queue, job, run_dir)
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
    emit({"file": str(file), "profiles": profiles}, as_json,
         f"{file}: ok" + (f" (profiles: {', '.join(profiles)})" if profiles else ""))


@app.command()
def schema(output: Optional[str] = typer.Option(None, "--output", "-o", metavar="FILE|DIR|-",
                                               help="Write the schema here (a directory: recipe.schema.json in it; "
                                                    "default and -: stdout)."),
           force: bool = o.FORCE, as_json: bool = JSON_OPTION) -> None:
    """Print the JSON Schema of recipe files, for editors (`# yaml-language-server: $schema=FILE` in a recipe)."""
    import json

    from toolkit.recipes.schema import SCHEMA_FILE, recipe_json_schema_text

    text = recipe_json_schema_text()
    path = output_target(output, SCHEMA_FILE.name)
    if path is not None:
        write_output(path, text, force)
        info(f"wrote {path} (a recipe's first line: # yaml-language-server: $schema={path.absolute()})")
    if as_json:
        emit({"schema": json.loads(text), "output": str(path) if path else None}, True)
    elif path is None:
        typer.echo(text, nl=False)


@app.command()
def new(name: str = typer.Argument(..., help="Recipe name ([a-z0-9_-]); the file is recipes/NAME.yaml."),
        script: Optional[str] = typer.Option(None, "--script", metavar="FILE.py", help="Your script."),
        module: Optional[str] = typer.Option(None, "--module", "-m", metavar="PKG.MODULE",
                                             help="Or your module (python -m PKG.MODULE)."),
        script_args: Optional[list[str]] = typer.Argument(None, metavar="-- SCRIPT_ARGS...",
                                                          help="Arguments for the script, after `--`."),
        nodes: int = typer.Option(1, "--nodes", "-N", min=1, help="Nodes of the job (resources.nodes)."),
        launcher: o.Launcher = typer.Option(o.Launcher.script, "--launcher", help="script (srun starts each rank) "
                                            "or torchrun (one torchrun per node starts its ranks)."),
        max_restarts: Optional[int] = typer.Option(None, "--max-restarts", min=0, help="torchrun restarts."),
        profile: Optional[str] = o.PROFILE, overrides: list[str] = o.SET, sweeps: list[str] = o.SWEEP,
        time: Optional[str] = o.TIME, hang_timeout: Optional[int] = o.HANG_TIMEOUT,
        spares: Optional[int] = o.SPARES, env: list[str] = o.ENV,
        venv: Optional[Path] = o.VENV, account: Optional[str] = o.ACCOUNT, qos: Optional[str] = o.QOS,
        reservation: Optional[str] = o.RESERVATION, dependency: Optional[str] = o.DEPENDENCY,
        output: Optional[str] = typer.Option(None, "--output", "-o", metavar="FILE|DIR|-",
                                             help="Where to write (default: recipes/NAME.yaml here; a directory: "
                                                  "NAME.yaml in it; -: stdout)."),
        force: bool = o.FORCE, as_json: bool = JSON_OPTION) -> None:
    """Write a recipe for your own script or module, from the same choices as `hpc run` (then edit the YAML)."""
    import re

    import yaml

    from toolkit.errors import UsageError
    from toolkit.recipes.load import apply_overlays, load_recipe
    from toolkit.recipes.schema import NAME_PATTERN, SCHEMA_FILE
    from toolkit.recipes.user import parse_env, recipe_name, user_recipe

    job = JobOptions(overrides, sweeps, profile, time, env, venv, account, qos, reservation, dependency)
    job.refuse("hpc recipes new", "a new recipe has no profiles yet", "profile")
    job.refuse("hpc recipes new", "a recipe is one job", "sweeps")
    job.refuse("hpc recipes new", "a recipe file holds no sbatch options", "account", "qos", "reservation",
               "dependency")
    if not re.match(NAME_PATTERN, name):
        raise UsageError(f"recipe name {name!r} is not lowercase letters, digits, - and _ (starting with a letter "
                         "or digit)", fix=f"e.g. hpc recipes new {recipe_name(name)} ...")
    target = script if script is not None else module
    if target is None or (script is not None and module is not None):
        raise UsageError("give exactly one of --script FILE.py and --module PKG.MODULE",
                         fix="e.g. hpc recipes new mytrain --script train.py")
    if module is not None and module.endswith(".py"):
        raise UsageError(f"--module {module!r} is a file name", fix=f"use --script {module}")
    o.check_time(time)
    data = user_recipe(target, script_args or [], name=name, nodes=nodes, style=launcher.value, time=time,
                       max_restarts=max_restarts, venv=str(venv) if venv else None, env=parse_env(env),
                       hang_timeout_s=hang_timeout, spares=spares, module=module is not None)
    if script is not None and not Path(script).is_file():
        raise UsageError(f"--script {script} does not exist", fix="give the path of an existing .py file")
    load_recipe(name, overrides=overrides, data=data)  # validated before anything is written, --set named
    data, _ = apply_overlays(data, None, overrides, Path(name))
    if output is None:  # the default, recipes/NAME.yaml here: the directory is made as needed
        Path("recipes").mkdir(exist_ok=True)
    path = output_target(output if output is not None else "recipes/", f"{name}.yaml")
    # The editor's schema is the installed hpc's own file, by absolute path: it is the schema of the loader that
    # will read this recipe and follows it through upgrades, where a copy (`hpc recipes schema -o`) would go
    # stale. On a machine without this installation the editor finds no schema and simply does not check.
    text = (f"# yaml-language-server: $schema={SCHEMA_FILE}\n"
            f"# Written by `hpc recipes new {name}`: edit freely, check with `hpc recipes validate "
            f"{shlex.quote(str(path or name + '.yaml'))}`.\n" + yaml.safe_dump(data, sort_keys=False))
    if path is not None:
        write_output(path, text, force)
    elif not as_json:
        typer.echo(text, nl=False)
    emit({"file": str(path) if path else None, "recipe": data, "text": None if path else text}, as_json,
         f"wrote {path} (submit it: hpc recipes submit {shlex.quote(str(path))})" if path else None)


@app.command()
def render(name: str = o.RECIPE, nodes: Optional[int] = o.NODES, cluster: Optional[Path] = o.CLUSTER,
           queue: Optional[str] = o.QUEUE, profile: Optional[str] = o.PROFILE, overrides: list[str] = o.SET,
           time: Optional[str] = o.TIME, hang_timeout: Optional[int] = o.HANG_TIMEOUT,
           spares: Optional[int] = o.SPARES, preflight: Optional[bool] = o.PREFLIGHT, env: list[str] = o.ENV,
           venv: Optional[Path] = o.VENV, account: Optional[str] = o.ACCOUNT, qos: Optional[str] = o.QOS,
           reservation: Optional[str] = o.RESERVATION, dependency: Optional[str] = o.DEPENDENCY,
           run_dir: Optional[Path] = RUN_DIR,
           output: Optional[str] = typer.Option(None, "--output", "-o", metavar="FILE|DIR|-",
                                                help="Write the script here (a directory: JOB_NAME.sbatch in it; "
                                                     "default and -: stdout)."),
           force: bool = o.FORCE, as_json: bool = JSON_OPTION) -> None:
    """Render a recipe as an sbatch script for a queue and node count."""
    from toolkit.slurm.render import render_script

    job = JobOptions(overrides, (), profile, time, env, venv, account, qos, reservation, dependency, hang_timeout,
                     spares, preflight)
    _, spec = _spec(name, nodes, cluster, queue, job, run_dir)
    script = render_script(spec)
    path = output_target(output, f"{spec.job_name}.sbatch")
    if path is not None:
        write_output(path, script, force)
        info(f"wrote {path}")
    if as_json:
        emit({"script": script, "output": str(path) if path else None, "job_name": spec.job_name,
              "run_dir": spec.run_dir, "warnings": list(spec.warnings)}, True)
    elif path is None:
        typer.echo(script, nl=False)


@app.command()
def submit(name: str = o.RECIPE, nodes: Optional[int] = o.NODES, cluster: Optional[Path] = o.CLUSTER,
           queue: Optional[str] = o.QUEUE, profile: Optional[str] = o.PROFILE, overrides: list[str] = o.SET,
           sweeps: list[str] = o.SWEEP, array_parallelism: Optional[int] = o.ARRAY_PARALLELISM,
           time: Optional[str] = o.TIME, hang_timeout: Optional[int] = o.HANG_TIMEOUT,
           spares: Optional[int] = o.SPARES, preflight: Optional[bool] = o.PREFLIGHT, env: list[str] = o.ENV,
           venv: Optional[Path] = o.VENV, account: Optional[str] = o.ACCOUNT, qos: Optional[str] = o.QOS,
           reservation: Optional[str] = o.RESERVATION, dependency: Optional[str] = o.DEPENDENCY,
           executor: Optional[o.Executor] = o.EXECUTOR, resume_from: Optional[str] = o.RESUME_FROM,
           avoid_suspects: bool = o.AVOID_SUSPECTS,
           dry_run: bool = o.DRY_RUN, verbose: bool = o.VERBOSE, wait: bool = o.WAIT,
           as_json: bool = JSON_OPTION) -> None:
    """Submit a recipe through submitit (srun starts one rank per GPU, or per declared CPU rank)."""
    from toolkit.submit import plan as plans

    job = JobOptions(overrides, sweeps, profile, time, env, venv, account, qos, reservation, dependency, hang_timeout,
                     spares, preflight)
    request = plans.SubmitRequest(name, nodes, str(cluster) if cluster else None, queue, profile,
                                  job.recipe_overrides(), job.slurm_options(), o.value(executor),
                                  resume_from=resume_from, avoid_suspects=avoid_suspects)
    submit_any(request, sweeps, array_parallelism, dry_run, wait, as_json, verbose)


def submit_any(request, sweeps, array_parallelism, dry_run: bool, wait: bool, as_json: bool,
               verbose: bool = False) -> None:
    """One job, or with --sweep one job array: `hpc recipes submit` and `hpc run` both come here."""
    from toolkit.errors import UsageError

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
        result.update(_follow(result, Path(result["run_dir"]), as_json))
        if result["state"] == State.COMPLETED:
            _print_outcome(result)
    emit(result, as_json, lambda r: f"{r['job_id']}" + (f" {r['state']}" if "state" in r else ""))
    if wait and result["state"] != State.COMPLETED:
        message = submission.failure_message(result["job_id"], result["state"], result)
        info(message)
        raise fail(message)


def _verbose_needs_dry_run(verbose: bool, dry_run: bool) -> None:
    if verbose and not dry_run:
        from toolkit.errors import UsageError

        raise UsageError("--verbose shows a dry run in full; a submitted job's scripts are in its run dir",
                         fix="add --dry-run to see what would be submitted, or leave out --verbose")


def _submit_sweep(request, sweeps: list[str], parallelism, dry_run: bool, wait: bool, as_json: bool,
                  verbose: bool) -> None:
    from toolkit.slurm.status import State
    from toolkit.rundir import RunDir
    from toolkit.submit import runs, summary, sweep

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
        result.update(_follow(result, plan.sweep_dir, as_json))
        if result["state"] == State.COMPLETED:
            _print_outcome(result)
        else:
            result["failed_tasks"] = runs.sweep_failed_tasks(plan.sweep_dir, meta)
    emit(result, as_json, lambda r: f"{r['job_id']}" + (f" {r['state']}" if "state" in r else ""))
    if wait and result["state"] != State.COMPLETED:
        for task in result["failed_tasks"]:
            info(f"task {task['job_id']} ended {task['state']}" + (f": see {task['log']}" if task["log"] else ""))
        raise fail(f"sweep {result['job_id']} ended {result['state']}: {len(result['failed_tasks'])} task(s) failed")


def _follow(result: dict, run: Path, as_json: bool) -> dict:
    """--wait: the job's end (submission.wait). Interrupted (Ctrl-C), the job goes on: the submission's data is
    still reported (its id, its run dir: --json kept none), and how to follow or end it."""
    from toolkit.errors import HpcError
    from toolkit.submit import submission

    try:
        outcome = submission.wait(result["job_id"], run, progress=info)
    except KeyboardInterrupt:
        job = result["job_id"]
        emit(result, as_json, lambda r: f"{r['job_id']}")
        raise HpcError(f"stopped following job {job}; it goes on (run dir {result['run_dir']})",
                       fix=f"follow it with `hpc jobs status {job}` or `hpc jobs logs {job} --follow`; end it with "
                           f"`hpc jobs cancel {job}`", exit_code=130) from None
    for line in submission.torchrun_restart_lines(outcome.get("torchrun_restarts") or []):
        info(f"job {result['job_id']}: {line}")
    return outcome


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
