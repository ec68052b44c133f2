"""Sweeps: one recipe over a grid of values, submitted as ONE Slurm job array (submitit's batch submission).

`--sweep KEY.PATH=V1,V2,...` takes the `--set` key syntax; each value is read like a `--set` value. `A..B`
(integers) stands for every integer from A to B; `\\,` is a comma inside a value, `\\\\` a backslash. Several
--sweep options make the cartesian product (the first varies slowest). Every grid point is validated, and its
job built, before anything is submitted; a point whose job differs from the others' in anything but the
command (nodes, environment, time: what the one batch script of an array fixes) is refused.

    <runs root>/<recipe>-sweep-<UTC time>-<nonce>/
        metadata.json   kind "sweep": the array's job id, the grid, the task count, the parallelism limit
        submitit/       the array's pickles and logs: <array>_<task>_<rank>_log.out / .err
        task-000/       one run dir per grid point: metadata.json (array job id, task index, the point's
        task-001/       overrides), recipe.yaml, job.sbatch; its ranks write result.json / failures/ here
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path
from typing import Any, Callable, Sequence

from toolkit.errors import HpcError, UsageError
from toolkit.submit import rundir

KIND = "sweep"
RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
SWEEP_FIX = "write --sweep KEY.PATH=V1,V2,... (e.g. --sweep args.--lr=0.1,0.2 or --sweep args.--seed=1..8)"


@dataclasses.dataclass(frozen=True)
class Point:
    index: int
    overrides: tuple[str, ...]  # KEY.PATH=VALUE, applied after the request's own --set

    def describe(self) -> str:
        return f"sweep point {self.index} ({', '.join(self.overrides)})"


@dataclasses.dataclass(frozen=True)
class Task:
    point: Point
    run_dir: Path
    recipe: Any
    spec: Any


def split_values(text: str) -> list[str]:
    """`a,b\\,c` -> ["a", "b,c"]: commas separate values unless escaped with a backslash."""
    values, current, chars = [], [], iter(text)
    for char in chars:
        if char == "\\":
            current.append(next(chars, "\\"))
        elif char == ",":
            values.append("".join(current))
            current = []
        else:
            current.append(char)
    values.append("".join(current))
    return values


def escape_value(value: str) -> str:
    """The inverse of split_values for one value (for scripts that build --sweep options)."""
    return value.replace("\\", "\\\\").replace(",", "\\,")


def parse_sweep(item: str) -> tuple[str, list[str]]:
    """`KEY.PATH=V1,V2,A..B` -> (KEY.PATH, [V1, V2, A, ..., B])."""
    key, sep, text = item.partition("=")
    if not sep or not key or "" in key.split("."):
        raise UsageError(f"--sweep {item!r} is not KEY.PATH=V1,V2,...", fix=SWEEP_FIX)
    values: list[str] = []
    for position, raw in enumerate(split_values(text), 1):
        if raw == "":
            raise UsageError(f"--sweep {item!r}: value {position} is empty",
                             fix="remove the extra comma (an empty string is not a sweep value)")
        match = RANGE.match(raw)
        if match is None:
            values.append(raw)
            continue
        first, last = int(match.group(1)), int(match.group(2))
        if last < first:
            raise UsageError(f"--sweep {item!r}: the range {raw} is empty", fix=f"write the smaller number first: {last}..{first}")
        values += [str(i) for i in range(first, last + 1)]
    return key, values


def grid(sweeps: Sequence[str]) -> list[Point]:
    """The cartesian product of the --sweep options, one Point per task (the first option varies slowest)."""
    axes: dict[str, list[str]] = {}
    for item in sweeps:
        key, values = parse_sweep(item)
        if key in axes:
            raise UsageError(f"--sweep {key} is given twice", fix="give each key once, with all its values")
        if len(set(values)) != len(values):
            twice = sorted({v for v in values if values.count(v) > 1})
            raise UsageError(f"--sweep {key}: {', '.join(twice)} given more than once",
                             fix="list each value once (a duplicate would run the same task twice)")
        axes[key] = values
    combos = itertools.product(*([f"{key}={v}" for v in values] for key, values in axes.items()))
    return [Point(i, tuple(combo)) for i, combo in enumerate(combos)]


def task_dir_name(index: int, count: int) -> str:
    return f"task-{index:0{max(3, len(str(count - 1)))}d}"


def task_job_id(array_id: str, index: int, count: int) -> str:
    """Slurm's id of one task ("ID_N"; submitit sends a one-point grid as a plain job: "ID")."""
    return f"{array_id}_{index}" if count > 1 else array_id


def plan(request, points: Sequence[Point], sweep_dir: Path) -> tuple[list[Task], Any, str, list[str]]:
    """(tasks, queue, executor, notes): every point's recipe and job, built and checked; nothing submitted."""
    from toolkit.job.spec import build_job_spec
    from toolkit.recipes.load import load_recipe
    from toolkit.submit import submission
    from toolkit.submit.executor import slurm_parameters

    tasks: list[Task] = []
    queue = executor = None
    notes: list[str] = []
    for point in points:
        run_dir = sweep_dir / task_dir_name(point.index, len(points))
        overrides = (*request.overrides, *point.overrides)
        try:
            if queue is None:
                recipe, queue, spec, executor, notes = submission.plan(
                    dataclasses.replace(request, overrides=overrides), run_dir=str(run_dir))
            else:
                recipe = load_recipe(request.recipe, profile=request.profile, overrides=overrides)
                spec = build_job_spec(recipe, queue, request.nodes, profile=request.profile, account=request.account,
                                      qos=request.qos, reservation=request.reservation,
                                      dependency=request.dependency, run_dir=str(run_dir))
        except HpcError as exc:
            raise type(exc)(f"{point.describe()}: {exc.message}", fix=exc.fix) from None
        tasks.append(Task(point, run_dir, recipe, spec))
    if executor != "slurm":
        raise UsageError("a sweep runs as a Slurm job array; the local executor has none",
                         fix="submit the sweep to Slurm (locally: make slurm-up), or submit points one by one")
    first = tasks[0].spec
    if first.mpi:
        raise HpcError(f"recipe {first.recipe} runs an MPI binary (sent as its sbatch script): it cannot be swept",
                       fix="submit each variation with `hpc recipes submit --set ...`")
    shared = slurm_parameters(first)
    for task in tasks[1:]:
        params = slurm_parameters(task.spec)
        changed = next((k for k in sorted(shared.keys() | params.keys()) if shared.get(k) != params.get(k)), None)
        if changed is not None:
            raise HpcError(f"{task.point.describe()} changes the job's {changed} ({shared.get(changed)!r} -> "
                           f"{params.get(changed)!r}): the tasks of one job array share one batch script",
                           fix="sweep only values that reach the command (args.*, dirs.*, launcher.*); submit "
                               "other variations as separate jobs")
    return tasks, queue, executor, notes


def max_array_size() -> int | None:
    """Slurm's MaxArraySize (task indices must stay below it), or None when it cannot be read."""
    from toolkit.slurm import commands

    res = commands.run(["scontrol", "show", "config"], check=False)
    match = re.search(r"^MaxArraySize\s*=\s*(\d+)", res.stdout, re.MULTILINE)
    return int(match.group(1)) if match else None


def dry_run(request, sweeps: Sequence[str]) -> dict[str, Any]:
    """The grid and the shared job parameters, every point validated; nothing is created or submitted."""
    import tempfile

    from toolkit.submit.executor import slurm_parameters

    points = grid(sweeps)
    with tempfile.TemporaryDirectory(prefix="hpc-sweep-") as scratch:
        tasks, queue, _executor, notes = plan(request, points, Path(scratch))
    params = slurm_parameters(tasks[0].spec)
    params.pop("setup")
    return {"tasks": len(points), "queue": queue.name, "notes": notes, "parameters": params,
            "points": [list(p.overrides) for p in points]}


def submit(request, sweeps: Sequence[str], parallelism: int | None = None,
           progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Validate every grid point, write the sweep dir and one run dir per task, submit one job array."""
    import yaml

    from toolkit import __version__
    from toolkit.job.render import render_script
    from toolkit.recipes.load import find_recipe
    from toolkit.slurm.commands import check_controller
    from toolkit.submit.executor import preflight

    points = grid(sweeps)
    recipe_file = find_recipe(request.recipe)
    name_hint = Path(request.recipe).stem + (f"-{request.profile}" if request.profile else "")
    sweep_dir = rundir.run_dir_path(f"{name_hint}-sweep")
    try:
        tasks, queue, executor, notes = plan(request, points, sweep_dir)
        for note in notes:
            progress(note)
        check_controller()
        preflight(tasks[0].spec)
        limit = max_array_size()
        if limit is not None and len(points) > limit:
            raise HpcError(f"the sweep has {len(points)} points; this Slurm allows at most {limit} tasks per array "
                           "(MaxArraySize)", fix="sweep fewer values, or split the grid into several sweeps")
        rundir.create(sweep_dir)  # only now: invalid input leaves the runs root untouched
        base = rundir.base_metadata(tasks[0].recipe.name, recipe_file)
        spec = tasks[0].spec
        shape = {"executor": executor, "queue": queue.name, "instance_type": queue.instance_type,
                 "nodes": spec.nodes, "ranks_per_node": spec.tasks_per_node, "ranks": spec.world_size}
        meta = {**base, "kind": KIND, "profile": request.profile, "overrides": list(request.overrides),
                "sweeps": list(sweeps), "tasks": len(tasks), "array_parallelism": parallelism, **shape,
                "array_job_id": None, "job_ids": []}
        rundir.write_json(sweep_dir / rundir.METADATA, meta)
        for task in tasks:
            task.run_dir.mkdir()
            (task.run_dir / "recipe.yaml").write_text(yaml.safe_dump(task.recipe.model_dump(mode="json"),
                                                                      sort_keys=False))
            (task.run_dir / "job.sbatch").write_text(render_script(task.spec))
            rundir.write_json(task.run_dir / rundir.METADATA, _task_metadata(base, meta, task, None))
        array_id = _submit_array(tasks, sweep_dir, parallelism, __version__)
    except BaseException:
        rundir.discard(sweep_dir)  # nothing submitted: leave nothing behind
        raise
    meta.update(array_job_id=array_id, job_ids=[array_id])
    rundir.write_json(sweep_dir / rundir.METADATA, meta)
    for task in tasks:
        rundir.write_json(task.run_dir / rundir.METADATA, _task_metadata(base, meta, task, array_id))
    return {"job_id": array_id, "run_dir": str(sweep_dir), "tasks": len(tasks), "executor": executor,
            "queue": queue.name, "nodes": spec.nodes, "ranks": spec.world_size,
            "follow": f"hpc jobs status {array_id}"}


def _task_metadata(base: dict, sweep_meta: dict, task: Task, array_id: str | None) -> dict[str, Any]:
    count = sweep_meta["tasks"]
    return {**base, "kind": "sweep-task", "sweep_dir": str(task.run_dir.parent), "task_index": task.point.index,
            "sweep_overrides": list(task.point.overrides), "profile": sweep_meta["profile"],
            "overrides": sweep_meta["overrides"] + list(task.point.overrides), "executor": sweep_meta["executor"],
            "queue": sweep_meta["queue"], "nodes": sweep_meta["nodes"], "ranks": sweep_meta["ranks"],
            "array_job_id": array_id,
            "job_ids": [task_job_id(array_id, task.point.index, count)] if array_id else []}


def _submit_array(tasks: Sequence[Task], sweep_dir: Path, parallelism: int | None, version: str) -> str:
    import submitit

    from toolkit.submit.executor import refused, sbatch_environment, slurm_executor
    from toolkit.submit.launcher import RankLauncher

    ex = slurm_executor(sweep_dir / "submitit", tasks[0].spec)
    if parallelism:
        ex.update_parameters(array_parallelism=parallelism)
    try:
        with sbatch_environment(), ex.batch():
            jobs = [ex.submit(RankLauncher.for_spec(task.spec, task.run_dir, version)) for task in tasks]
    except submitit.core.utils.FailedJobError as exc:  # sbatch refused the array
        raise refused(str(exc).strip().splitlines()) from None
    return str(jobs[0].job_id).split("_")[0]


# -- status -------------------------------------------------------------------------------------------------------

def task_statuses(run: Path, meta: dict, found: dict) -> list:
    """Each task's RunStatus: Slurm's view (`found`, from toolkit.slurm.status.query), else its run dir's."""
    from toolkit.slurm import status as slurm_status
    from toolkit.submit.runs import RunStatus, state_from_run_dir

    array_id, count = str(meta.get("array_job_id")), int(meta.get("tasks", 0))
    ids = [task_job_id(array_id, index, count) for index in range(count)]
    if any(job_id not in found for job_id in ids):  # accounting lags the controller by a moment: ask it too
        try:
            found = {**slurm_status.live([array_id]), **found}
        except HpcError:
            pass  # the controller is down: the run dirs still say how tasks ended
    out = []
    for index in range(count):
        job_id, task_dir = task_job_id(array_id, index, count), run / task_dir_name(index, count)
        s = found.get(job_id)
        if s is None:
            out.append(RunStatus(job_id, state_from_run_dir(task_dir), "run-dir", str(task_dir), meta.get("recipe"),
                                 meta.get("nodes")))
        else:
            out.append(RunStatus(job_id, s.state, s.source, str(task_dir), meta.get("recipe"), meta.get("nodes"),
                                 s.requeues, s.exit_code, s.reason))
    return out


def summary(run: Path, meta: dict, found: dict):
    """The array as one RunStatus: a count per state; RUNNING/PENDING while any task is, else COMPLETED when
    every task completed, else FAILED (UNKNOWN while neither Slurm nor any run dir knows a task yet)."""
    from toolkit.submit.runs import RunStatus

    tasks = task_statuses(run, meta, found)
    counts: dict[str, int] = {}
    for t in tasks:
        counts[t.state] = counts.get(t.state, 0) + 1
    active = [t for t in tasks if not t.done and t.state != "UNKNOWN"]
    if active:
        state = "PENDING" if all(t.state == "PENDING" for t in active) else "RUNNING"
    elif set(counts) == {"UNKNOWN"}:
        state = "UNKNOWN"
    else:
        state = "COMPLETED" if set(counts) == {"COMPLETED"} else "FAILED"
    source = next((t.source for t in tasks if t.source != "run-dir"), "run-dir")
    return RunStatus(str(meta.get("array_job_id")), state, source, str(run), meta.get("recipe"), meta.get("nodes"),
                     sum(t.requeues for t in tasks), tasks=counts)


def status(job_id: str, run: Path, meta: dict):
    """`hpc jobs status` of a sweep: the array's summary (ID), or one task (ID_N)."""
    from toolkit.slurm import status as slurm_status

    found = slurm_status.query([str(meta.get("array_job_id"))])
    if job_id == str(meta.get("array_job_id")) and int(meta.get("tasks", 0)) > 1:
        return summary(run, meta, found)
    for task in task_statuses(run, meta, found):
        if task.job_id == job_id:
            return task
    raise HpcError(f"sweep {run.name} has no task {job_id}",
                   fix=f"its tasks are {task_job_id(str(meta.get('array_job_id')), 0, 2)} .. "
                       f"{task_job_id(str(meta.get('array_job_id')), int(meta.get('tasks', 1)) - 1, 2)}")


def failed_tasks(run: Path, meta: dict) -> list[dict[str, Any]]:
    """The tasks that did not complete, each with the log of its first failing rank (if any)."""
    from toolkit.slurm import status as slurm_status
    from toolkit.submit.submission import failed_rank_log

    found = slurm_status.query([str(meta.get("array_job_id"))])
    return [{"job_id": t.job_id, "state": t.state, "run_dir": t.run_dir,
             "log": failed_rank_log(t.job_id, Path(t.run_dir), logs=run / "submitit")}
            for t in task_statuses(run, meta, found) if t.state != "COMPLETED"]
