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
from typing import Any, Sequence

from toolkit.errors import HpcError, UsageError
from toolkit.submit import rundir, runs
from toolkit.submit.plan import PLAN_FILE
RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
SWEEP_FIX = "write --sweep KEY.PATH=V1,V2,... (e.g. --sweep args.--lr=0.1,0.2 or --sweep args.--seed=1..8)"


@dataclasses.dataclass(frozen=True)
class Point:
    index: int
    overrides: tuple[str, ...]  # KEY.PATH=VALUE, applied after the request's own --set

    def describe(self) -> str:
        return f"sweep point {self.index} ({', '.join(self.overrides)})"


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


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """A sweep, planned once: one Plan per grid point (each its own run dir) and the one array they form."""

    request: Any  # toolkit.submit.plan.SubmitRequest
    sweeps: tuple[str, ...]
    sweep_dir: Path
    points: tuple[Point, ...]
    tasks: tuple[Any, ...]  # toolkit.submit.plan.Plan, one per point
    parallelism: int | None
    parameters: dict[str, Any]  # the array's submitit parameters (every task's, plus the parallelism limit)
    batch_script: str  # the array's batch script, as submitit will send it
    metadata: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        first = self.tasks[0]
        return {"kind": runs.SWEEP, "executor": first.executor, "run_dir": str(self.sweep_dir),
                "queue": first.queue.name, "tasks": len(self.tasks), "nodes": first.spec.nodes,
                "ranks": first.spec.world_size, "python": first.python, "parameters": self.parameters,
                "notes": list(first.notes), "warnings": sorted({w for t in self.tasks for w in t.warnings}),
                "points": [list(p.overrides) for p in self.points],
                "task_run_dirs": [str(t.run_dir) for t in self.tasks],
                "script": first.script, "batch_script": self.batch_script}


def new_sweep_dir(request, root: Path | None = None) -> Path:
    """A fresh sweep dir path for a request (created by execute())."""
    return rundir.run_dir_path(f"{request.run_name}-sweep", root)


def plan(request, sweeps: Sequence[str], parallelism: int | None = None,
         sweep_dir: Path | None = None) -> SweepPlan:
    """Every point's plan, built and checked, and the array's parameters; nothing written or submitted."""
    from toolkit.submit import plan as plans
    from toolkit.submit.executor import submitit_batch_script

    points = grid(sweeps)
    sweep_dir = sweep_dir or new_sweep_dir(request)
    tasks: list[plans.Plan] = []
    for point in points:
        point_request = dataclasses.replace(request, overrides=(*request.overrides, *point.overrides))
        run_dir = sweep_dir / rundir.task_dir_name(point.index, len(points))
        try:
            tasks.append(plans.plan(point_request, run_dir, task_of=tasks[0] if tasks else None))
        except HpcError as exc:
            raise type(exc)(f"{point.describe()}: {exc.message}", fix=exc.fix) from None
    first = tasks[0]
    if first.executor == "submitit-local":
        raise UsageError("a sweep runs as a Slurm job array; the local executor has none",
                         fix="submit the sweep to Slurm (locally: make slurm-up), or submit points one by one")
    if first.executor == "sbatch":
        raise HpcError(f"recipe {first.recipe.name} runs an MPI binary (sent as its sbatch script): it cannot be "
                       "swept", fix="submit each variation with `hpc recipes submit --set ...`")
    shared = _flat(first.parameters)
    for task, point in zip(tasks[1:], points[1:]):
        params = _flat(task.parameters)
        changed = next((k for k in sorted(shared.keys() | params.keys()) if shared.get(k) != params.get(k)), None)
        if changed is not None:
            raise HpcError(f"{point.describe()} changes the job's {changed} ({shared.get(changed)!r} -> "
                           f"{params.get(changed)!r}): the tasks of one job array share one batch script",
                           fix="sweep only values that reach the command (args.*, dirs.*, launcher.*); submit "
                               "other variations as separate jobs")
    parameters = {**first.parameters, **({"array_parallelism": parallelism} if parallelism else {})}
    meta = {**first.metadata, "kind": runs.SWEEP, "overrides": list(request.overrides), "sweeps": list(sweeps),
            "tasks": len(tasks), "array_parallelism": parallelism, "array_job_id": None, "job_ids": []}
    return SweepPlan(request=request, sweeps=tuple(sweeps), sweep_dir=sweep_dir, points=tuple(points),
                     tasks=tuple(tasks), parallelism=parallelism, parameters=parameters,
                     batch_script=submitit_batch_script(first.spec, sweep_dir / "submitit", len(tasks), parallelism),
                     metadata=meta)


def _flat(parameters: dict[str, Any]) -> dict[str, Any]:
    """submitit parameters with the sbatch options (additional_parameters) at the top level."""
    flat = {k: v for k, v in parameters.items() if k != "additional_parameters"}
    flat.update(parameters.get("additional_parameters") or {})
    return flat


def max_array_size() -> int | None:
    """Slurm's MaxArraySize (task indices must stay below it), or None when it cannot be read."""
    from toolkit.slurm import commands

    res = commands.run(["scontrol", "show", "config"], check=False)
    match = re.search(r"^MaxArraySize\s*=\s*(\d+)", res.stdout, re.MULTILINE)
    return int(match.group(1)) if match else None


def execute(sp: SweepPlan) -> str:
    """Check Slurm takes the job, write the sweep dir and every task's run dir, submit one job array."""
    import json

    from toolkit.submit.plan import check_slurm_accepts, write_run_dir

    check_slurm_accepts(sp.tasks[0])
    limit = max_array_size()
    if limit is not None and len(sp.tasks) > limit:
        raise HpcError(f"the sweep has {len(sp.tasks)} points; this Slurm allows at most {limit} tasks per array "
                       "(MaxArraySize)", fix="sweep fewer values, or split the grid into several sweeps")
    try:
        rundir.create(sp.sweep_dir)  # only now: invalid input leaves the runs root untouched
        (sp.sweep_dir / PLAN_FILE).write_text(json.dumps(sp.to_json(), indent=2) + "\n")
        rundir.write_json(sp.sweep_dir / rundir.METADATA, sp.metadata)
        for task, point in zip(sp.tasks, sp.points):
            write_run_dir(task, _task_metadata(sp, point, None))
        array_id = _submit_array(sp)
    except BaseException:
        rundir.discard(sp.sweep_dir)  # nothing submitted: leave nothing behind
        raise
    rundir.write_json(sp.sweep_dir / rundir.METADATA, {**sp.metadata, "array_job_id": array_id, "job_ids": [array_id]})
    for task, point in zip(sp.tasks, sp.points):
        rundir.write_json(task.run_dir / rundir.METADATA, _task_metadata(sp, point, array_id))
    return array_id


def _task_metadata(sp: SweepPlan, point: Point, array_id: str | None) -> dict[str, Any]:
    """A task's metadata.json: its plan's (overrides include the point's), where it sits in the sweep."""
    task = sp.tasks[point.index]
    return {**task.metadata, "kind": "sweep-task", "sweep_dir": str(sp.sweep_dir), "task_index": point.index,
            "sweep_overrides": list(point.overrides), "array_job_id": array_id,
            "job_ids": [rundir.task_job_id(array_id, point.index, len(sp.tasks))] if array_id else []}


def _submit_array(sp: SweepPlan) -> str:
    import submitit

    from toolkit import __version__
    from toolkit.submit.executor import refused, sbatch_environment, slurm_executor
    from toolkit.submit.launcher import RankLauncher

    first = sp.tasks[0]
    ex = slurm_executor(sp.sweep_dir / "submitit", sp.parameters, first.python)
    try:
        with sbatch_environment(), ex.batch():
            jobs = [ex.submit(RankLauncher.for_spec(task.spec, task.run_dir, __version__)) for task in sp.tasks]
    except submitit.core.utils.FailedJobError as exc:  # sbatch refused the array
        raise refused(str(exc).strip().splitlines()) from None
    return str(jobs[0].job_id).split("_")[0]
