"""Sweeps: one recipe over a grid of values, submitted as Slurm job arrays (submitit's batch submission).

`--sweep KEY.PATH=V1,V2,...` takes the `--set` key syntax; each value is read like a `--set` value. Ranges:
`A..B` (integers) stands for every integer from A to B, `A..B:STEP` for A, A+STEP, ... up to B (decimals too:
`0.1..0.4:0.1` is 0.1, 0.2, 0.3, 0.4, computed in exact decimals); a range of decimals without a step, or
anything else number-like around `..`, is refused with these forms rather than swept as one literal value.
`\\,` is a comma inside a value, `\\\\` a backslash. Several
--sweep options make the cartesian product (the first varies slowest). Every grid point is validated, and its
job built, before anything is submitted; a point whose job differs from the others' in anything but the
command (nodes, environment, time: what the one batch script of an array fixes) is refused.

Every point writes its own checkpoints and logs: training programs (ours, and the launchers') resume from the last
checkpoint they find, so points sharing one dir would continue each other's runs. A recipe's relative checkpoint/log
dirs therefore go under each task's run dir (dirs.<name>.under=run), and a sweep whose points would still share one
(an absolute dir) is refused.

Slurm refuses an array whose task indices reach MaxArraySize (the target cluster's: a --cluster config's, else
`scontrol show config`; default 1001, often lower: array_limit), and submitit numbers a batch of N as
`--array=0-(N-1)`: a larger sweep is split into consecutive chunks of at most MaxArraySize tasks, one array each
(HPC_MAX_ARRAY_SIZE caps the chunk lower still).

    <runs root>/<recipe>-sweep-<UTC time>-<nonce>/
        metadata.json   kind "sweep": the arrays (job id, first task, task count), the grid, the parallelism
        submitit/       the arrays' pickles and logs: <array>_<task in array>_<rank>_log.out / .err
        task-000/       one run dir per grid point: metadata.json (its array's job id, its index in the sweep
        task-001/       and in the array, the point's overrides), recipe.yaml, job.sbatch; result.json / failures/
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path
from typing import Any, Sequence

from toolkit import rundir
from toolkit.errors import HpcError, UsageError
from toolkit.recipes.load import Override
from toolkit.rundir import SWEEP, SWEEP_TASK, Array, Metadata, RunDir

NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
RANGE = re.compile(rf"^(?P<first>{NUMBER})\.\.(?P<last>{NUMBER})(?::(?P<step>{NUMBER}))?$")
RANGE_LIKE = re.compile(r"^[-+]?[\d.]*\d[\d.eE+-]*\.\.")  # a value meant as a range (not a path like ../x)
RANGE_FORMS = "A..B (every integer from A to B) or A..B:STEP (e.g. 0.1..0.4:0.1, 1e-4..5e-4:1e-4)"
MAX_RANGE_POINTS = 10_000
SLURM_DEFAULT_MAX_ARRAY_SIZE = 1001  # slurm.conf(5)'s default: ParallelCluster's, or where scontrol does not answer
MAX_ARRAY_SIZE_ENV = "HPC_MAX_ARRAY_SIZE"
SWEEP_FIX = ("write --sweep KEY.PATH=V1,V2,... (e.g. --sweep args.--lr=0.1,0.2, --sweep args.--seed=1..8 or "
             "--sweep args.--lr=0.1..0.4:0.1)")


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
                             fix="remove the extra comma (an empty string is not a sweep value)" if "," in text else
                                 f"give the values after the =: --sweep {key}=V1,V2,...")
        if RANGE_LIKE.match(raw) is None:
            values.append(raw)
            continue
        values += range_values(item, raw)
    return key, values


def range_values(item: str, raw: str) -> list[str]:
    """`A..B` (integers) or `A..B:STEP` -> the values, in exact decimal arithmetic (0.1 + 0.2 is 0.3)."""
    from decimal import Decimal

    match = RANGE.match(raw)
    if match is None:
        raise UsageError(f"--sweep {item!r}: {raw} is not a range", fix=f"write a range as {RANGE_FORMS}")
    first, last = Decimal(match["first"]), Decimal(match["last"])
    step = Decimal(match["step"]) if match["step"] else None
    if step is None and not all(re.fullmatch(r"[-+]?\d+", match[end]) for end in ("first", "last")):
        example = format(((last - first) / 3).normalize(), "f") if last > first else "STEP"
        raise UsageError(f"--sweep {item!r}: the range {raw} has no step, and only integer ranges step by 1",
                         fix=f"give the step: {raw}:STEP (e.g. {raw}:{example}), or list the values: V1,V2,...")
    if last < first:
        raise UsageError(f"--sweep {item!r}: the range {raw} is empty",
                         fix=f"write the smaller number first: {match['last']}..{match['first']}"
                             + (f":{match['step']}" if match["step"] else ""))
    step = step if step is not None else Decimal(1)
    if step <= 0:
        raise UsageError(f"--sweep {item!r}: the step of {raw} must be above 0", fix=f"write a range as {RANGE_FORMS}")
    count = int((last - first) / step) + 1
    if count > MAX_RANGE_POINTS:
        raise UsageError(f"--sweep {item!r}: the range {raw} has {count} values (at most {MAX_RANGE_POINTS})",
                         fix=f"use a larger step or a narrower range: {RANGE_FORMS}")
    return [format((first + i * step).normalize(), "f") for i in range(count)]


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
    combos = itertools.product(*([Override(f"{key}={v}", "--sweep") for v in values] for key, values in axes.items()))
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
    parameters: dict[str, Any]  # each array's submitit parameters (every task's, plus the parallelism limit)
    max_array_size: int  # tasks per array at most (see array_limit)
    max_array_size_source: str  # where that limit comes from, in words
    chunks: tuple[range, ...]  # the sweep's task indices each array holds, in submission order
    batch_script: str  # the first array's batch script, as submitit will send it
    metadata: Metadata  # the sweep dir's, before its arrays are submitted
    warnings: tuple[str, ...] = ()  # the sweep's own (its tasks' are theirs)

    def to_json(self) -> dict[str, Any]:
        first = self.tasks[0]
        return {"kind": SWEEP, "executor": first.executor, "run_dir": str(self.sweep_dir),
                "queue": first.queue.name, "tasks": len(self.tasks), "nodes": first.spec.nodes,
                "ranks": first.spec.world_size, "python": first.python, "parameters": self.parameters,
                "notes": list(first.notes),
                "warnings": [*self.warnings, *sorted({w for t in self.tasks for w in t.warnings})],
                "max_array_size": self.max_array_size, "max_array_size_source": self.max_array_size_source,
                "arrays": [{"first": c.start, "count": len(c)} for c in self.chunks],
                "points": [list(p.overrides) for p in self.points],
                "task_run_dirs": [str(t.run_dir) for t in self.tasks],
                "script": first.script, "batch_script": self.batch_script}


def new_sweep_dir(request, root: Path | None = None) -> Path:
    """A fresh sweep dir path for a request (created by execute())."""
    return rundir.run_dir_path(f"{request.run_name}-sweep", root)


def plan(request, sweeps: Sequence[str], parallelism: int | None = None,
         sweep_dir: Path | None = None) -> SweepPlan:
    """Every point's plan, built and checked, and the array's parameters; nothing written or submitted."""
    from toolkit.submit import plan as plans, runsroot
    from toolkit.slurm.executors import submitit_batch_script

    points = grid(sweeps)
    plans.refuse_conflicts(dataclasses.replace(request, overrides=tuple(Override(s, "--sweep") for s in sweeps)))
    root = None
    if sweep_dir is None:
        from toolkit.cluster.queues import resolve_queue

        root = runsroot.choose(resolve_queue(request.cluster, request.queue)[0])
        sweep_dir = new_sweep_dir(request, root.path)
    own_dirs = _own_output_dirs(request)
    tasks: list[plans.Plan] = []
    for point in points:
        point_request = dataclasses.replace(request, overrides=(*request.overrides, *own_dirs, *point.overrides))
        run_dir = sweep_dir / rundir.task_dir_name(point.index, len(points))
        try:
            tasks.append(plans.plan(point_request, run_dir, task_of=tasks[0] if tasks else None, array=True))
        except HpcError as exc:
            raise type(exc)(f"{point.describe()}: {exc.message}", fix=exc.fix) from None
    _refuse_shared_output_dirs(tasks, points)
    home = runsroot.refuse_home_sweep(root, [t.spec for t in tasks]) if root is not None else None
    first = tasks[0]
    from toolkit.target import target_for

    refusal = target_for(first.executor).sweep_refusal(first.recipe.name)
    if refusal is not None:
        if request.executor == first.executor.value:  # asked for by name: two options that cannot go together
            raise UsageError(refusal.message, fix=refusal.fix)
        raise refusal
    shared = _flat(first.parameters)
    for task, point in zip(tasks[1:], points[1:], strict=True):
        params = _flat(task.parameters)
        changed = next((k for k in sorted(shared.keys() | params.keys()) if shared.get(k) != params.get(k)), None)
        if changed is not None:
            raise HpcError(f"{point.describe()} changes the job's {changed} "
                           f"({_difference(shared.get(changed), params.get(changed))}): the tasks of one job array "
                           "share one batch script",
                           fix="sweep only values that reach the command (args.*, dirs.*, launcher.*); submit "
                               "other variations as separate jobs")
    parameters = {**first.parameters, **({"array_parallelism": parallelism} if parallelism else {})}
    limit, limit_source = array_limit(request.cluster)
    parts = chunks(len(tasks), limit)
    meta = dataclasses.replace(Metadata.from_json(first.metadata), kind=SWEEP, overrides=list(request.overrides),
                               sweeps=list(sweeps), tasks=len(tasks), array_parallelism=parallelism,
                               max_array_size=limit, arrays=[], job_ids=[])
    return SweepPlan(request=request, sweeps=tuple(sweeps), sweep_dir=sweep_dir, points=tuple(points),
                     tasks=tuple(tasks), parallelism=parallelism, parameters=parameters, max_array_size=limit,
                     max_array_size_source=limit_source,
                     chunks=parts, batch_script=submitit_batch_script(first.spec, sweep_dir / "submitit",
                                                                      len(parts[0]), parallelism),
                     metadata=meta, warnings=(home,) if home else ())


def _own_output_dirs(request) -> tuple[str, ...]:
    """Overrides that put the recipe's checkpoint and log dirs under each task's own run dir (where they are
    under the dirs root: one dir for every point)."""
    from toolkit.recipes.load import load_recipe
    from toolkit.recipes.schema import OUTPUT_DIRS

    recipe = load_recipe(request.recipe, profile=request.profile, overrides=request.overrides,
                         data=request.recipe_data)
    return tuple(f"dirs.{name}.under=run" for name in OUTPUT_DIRS
                 if (entry := getattr(recipe.dirs, name)) is not None and entry.under != "run")


def _difference(before: Any, after: Any, width: int = 160) -> str:
    """What changed, short: the lines one list has and the other has not (a batch script's set-up is hundreds of
    lines, its node bundle 100 KB: the whole of both made a 200 KB message), else both values, cut to `width`."""
    def cut(value: Any) -> str:
        text = repr(value)
        return text if len(text) <= width else text[:width - 3] + "..."
    if isinstance(before, list) and isinstance(after, list):
        gone, new = [x for x in before if x not in after], [x for x in after if x not in before]
        if gone or new:
            return f"{' '.join(map(cut, gone[:2])) or 'nothing'} -> {' '.join(map(cut, new[:2])) or 'nothing'}"
    return f"{cut(before)} -> {cut(after)}"


def _refuse_shared_output_dirs(tasks: Sequence[Any], points: Sequence[Point]) -> None:
    """Two points with one checkpoint or log dir (absolute, or swept to one value) would resume each other."""
    from toolkit.recipes.schema import OUTPUT_DIRS

    for name in OUTPUT_DIRS:
        owner: dict[str, Point] = {}
        for task, point in zip(tasks, points, strict=True):
            path = task.spec.dirs.get(name)
            if path is None:
                continue
            if path in owner:
                raise HpcError(f"{point.describe()} and {owner[path].describe()} share the {name} dir {path}: "
                               "each would resume from the other's last checkpoint",
                               fix=f"give dirs.{name}.dir as a relative path (each point then gets its own under "
                                   f"its run dir), or sweep dirs.{name}.dir too")
            owner[path] = point


def chunks(count: int, limit: int) -> tuple[range, ...]:
    """Task indices 0..count-1 as consecutive chunks of at most `limit` (one job array each)."""
    return tuple(range(first, min(first + limit, count)) for first in range(0, count, limit))


def _flat(parameters: dict[str, Any]) -> dict[str, Any]:
    """submitit parameters with the sbatch options (additional_parameters) at the top level."""
    flat = {k: v for k, v in parameters.items() if k != "additional_parameters"}
    flat.update(parameters.get("additional_parameters") or {})
    return flat


def max_array_size() -> int | None:
    """Slurm's MaxArraySize (task indices must stay below it), or None when it cannot be read."""
    from toolkit.slurm import commands

    try:
        res = commands.run(["scontrol", "show", "config"], check=False)
    except HpcError:  # no Slurm here, or it does not answer (a dry run): the caller assumes Slurm's default
        return None
    match = re.search(r"^MaxArraySize\s*=\s*(\d+)", res.stdout, re.MULTILINE)
    return int(match.group(1)) if match else None


def config_max_array_size(path: str) -> tuple[int, str]:
    """The MaxArraySize of the cluster a ParallelCluster config describes, and where it comes from: its
    Scheduling/SlurmSettings/CustomSlurmSettings (names are case-insensitive there: aws-parallelcluster
    pcluster/validators/slurm_settings_validator.py), else Slurm's default, which ParallelCluster keeps (its
    slurm.conf sets none: aws-parallelcluster-cookbook cookbooks/aws-parallelcluster-slurm/templates/default/slurm/
    slurm.conf.erb and files/default/head_node_slurm/slurm/templates/slurm_parallelcluster.conf)."""
    from toolkit.cluster.configfile import read_config

    settings = (read_config(path)[1].get("Scheduling") or {}).get("SlurmSettings") or {}
    value = next((v for entry in settings.get("CustomSlurmSettings") or [] if isinstance(entry, dict)
                  for k, v in entry.items() if str(k).lower() == "maxarraysize"), None)
    if value is None:
        unread = (", and its CustomSlurmSettingsIncludeFile was not read: set HPC_MAX_ARRAY_SIZE if that sets one"
                  if settings.get("CustomSlurmSettingsIncludeFile") else "")
        return SLURM_DEFAULT_MAX_ARRAY_SIZE, (f"Slurm's default (neither the CustomSlurmSettings of {path} nor "
                                              f"ParallelCluster sets it{unread})")
    if not str(value).isdigit():
        raise HpcError(f"{path}: Scheduling/SlurmSettings/CustomSlurmSettings MaxArraySize={value!r} is not a whole "
                       "number", fix="set it to the most tasks plus one a job array may hold (Slurm's default is "
                                     "1001), or remove it")
    return int(value), f"from the CustomSlurmSettings of {path}"


def array_limit(cluster: str | None = None) -> tuple[int, str]:
    """Tasks per array, and where that number comes from in words: the target cluster's MaxArraySize (with
    --cluster FILE that config's, else this cluster's `scontrol show config`, Slurm's default where it does not
    answer), capped by $HPC_MAX_ARRAY_SIZE (a site that wants smaller arrays; tests that split a sweep on any
    cluster). MaxArraySize 0 disables job arrays (SchedMD/slurm doc/man/man5/slurm.conf.5): refused."""
    import os

    if cluster is not None:
        limit, source = config_max_array_size(cluster)
    else:
        scontrol = max_array_size()
        limit, source = ((scontrol, "from `scontrol show config` on this cluster") if scontrol is not None else
                         (SLURM_DEFAULT_MAX_ARRAY_SIZE, "Slurm's default (`scontrol show config` did not answer)"))
    if limit == 0:
        raise HpcError(f"MaxArraySize is 0, {source}: that cluster has job arrays disabled, and a sweep is one",
                       fix="submit each point as its own job (hpc recipes submit --set KEY.PATH=VALUE), or ask the "
                           "cluster's admin for MaxArraySize (CustomSlurmSettings in its config)")
    cap = os.environ.get(MAX_ARRAY_SIZE_ENV)
    if cap is not None and (not cap.isdigit() or int(cap) < 1):
        raise HpcError(f"{MAX_ARRAY_SIZE_ENV}={cap!r} is not a positive whole number",
                       fix="set it to the most tasks one job array may hold (e.g. 100), or unset it")
    if cap is not None and int(cap) < limit:
        return int(cap), f"${MAX_ARRAY_SIZE_ENV}, below MaxArraySize {limit}, {source}"
    return limit, f"MaxArraySize, {source}"


def execute(sp: SweepPlan) -> str:
    """Check Slurm takes the job, write the sweep dir and every task's run dir, submit one job array per chunk.
    Returns the sweep's id: its first array's job id (any array's id names the sweep in `hpc jobs`)."""
    from toolkit.submit.plan import write_run_dir
    from toolkit.target import target_for

    target_for(sp.tasks[0].executor).check(sp.tasks[0])
    sweep_dir = RunDir(sp.sweep_dir)
    arrays: list[Array] = []
    try:
        sweep_dir.create()  # only now: invalid input leaves the runs root untouched
        sweep_dir.write_plan(sp.to_json())
        sweep_dir.write_metadata(sp.metadata)
        for task, point in zip(sp.tasks, sp.points, strict=True):
            write_run_dir(task, _task_metadata(sp, point, None))
        for chunk in sp.chunks:
            arrays.append(Array(_submit_array(sp, chunk), chunk.start, len(chunk)))
    except BaseException:
        _cancel([a.job_id for a in arrays])  # a later array was refused: no half sweep keeps running
        sweep_dir.discard()  # nothing (left) submitted: leave nothing behind
        raise
    ids = [a.job_id for a in arrays]
    sweep_dir.write_metadata(dataclasses.replace(sp.metadata, arrays=arrays, array_job_id=ids[0], job_ids=ids))
    for array in arrays:
        for point in sp.points[array.first:array.first + array.count]:
            RunDir(sp.tasks[point.index].run_dir).write_metadata(_task_metadata(sp, point, array))
    return ids[0]


def _cancel(job_ids: list[str]) -> None:
    if job_ids:
        from toolkit.slurm import commands

        commands.run(["scancel", *job_ids], check=False)  # not the target's cancel: this one never raises


def _task_metadata(sp: SweepPlan, point: Point, array: Array | None) -> Metadata:
    """A task's metadata.json: its plan's (overrides include the point's), where it sits in the sweep."""
    meta = dataclasses.replace(Metadata.from_json(sp.tasks[point.index].metadata), kind=SWEEP_TASK,
                               sweep_dir=str(sp.sweep_dir), task_index=point.index,
                               sweep_overrides=list(point.overrides), job_ids=[])
    if array is None:
        return meta
    in_array = point.index - array.first
    return dataclasses.replace(meta, array_job_id=array.job_id, array_task=in_array,
                               job_ids=[array.task_job_id(in_array)])


def _submit_array(sp: SweepPlan, chunk: range) -> str:
    """One array of the chunk's tasks (submitit numbers them 0..len-1); its job id."""
    import submitit

    from toolkit import __version__
    from toolkit.slurm.executors import refused, sbatch_environment, slurm_executor
    from toolkit.slurm.rank_task import RankTask

    first = sp.tasks[0]
    ex = slurm_executor(sp.sweep_dir / "submitit", sp.parameters, first.python)
    try:
        with sbatch_environment(), ex.batch():
            jobs = [ex.submit(RankTask.for_spec(sp.tasks[i].spec, sp.tasks[i].run_dir, __version__))
                    for i in chunk]
    except submitit.core.utils.FailedJobError as exc:  # sbatch refused the array
        raise refused(str(exc).strip().splitlines()) from None
    return str(jobs[0].job_id).split("_")[0]
