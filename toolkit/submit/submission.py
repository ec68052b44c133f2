"""`hpc recipes submit`: recipe -> job spec -> run dir -> submitit (or sbatch for MPI binaries) -> wait.

Nothing is left half done: the run dir is removed again when Slurm refuses the job.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from toolkit.errors import HpcError
from toolkit.submit import rundir


@dataclasses.dataclass
class SubmitRequest:
    recipe: str
    nodes: int | None = None
    cluster: str | None = None
    queue: str | None = None
    profile: str | None = None
    overrides: Sequence[str] = ()
    account: str | None = None
    qos: str | None = None
    reservation: str | None = None
    dependency: str | None = None
    executor: str | None = None


def plan(request: SubmitRequest, run_dir: str | None = None):
    """(recipe, queue, job spec, notes) for a request: everything decided, nothing submitted."""
    from toolkit.cluster.queues import resolve_queue
    from toolkit.job.spec import build_job_spec
    from toolkit.recipes.load import load_recipe
    from toolkit.submit.executor import choose_executor

    recipe = load_recipe(request.recipe, profile=request.profile, overrides=request.overrides)
    executor, note = choose_executor(request.executor)
    notes = [note] if note else []
    if executor == "slurm":
        from toolkit.slurm.discovery import use_discovered_slurm

        use_discovered_slurm()
    queue, how = resolve_queue(request.cluster, request.queue)
    notes.append(f"queue: {how}")
    spec = build_job_spec(recipe, queue, request.nodes, profile=request.profile, account=request.account,
                          qos=request.qos, reservation=request.reservation, dependency=request.dependency,
                          run_dir=run_dir)
    return recipe, queue, spec, executor, notes


def dry_run(request: SubmitRequest) -> dict[str, Any]:
    """What would be submitted: executor parameters, setup lines, rank 0's argv, the equivalent script."""
    from toolkit.job.render import render_script
    from toolkit.job.rank import RANK0_PREVIEW, resolve_argv
    from toolkit.submit.executor import node_python, slurm_parameters

    _recipe, _queue, spec, executor, notes = plan(request)
    rank0 = resolve_argv(spec.command, RANK0_PREVIEW)
    return {"executor": executor, "notes": notes, "python": node_python(spec),
            "parameters": slurm_parameters(spec) if executor == "slurm" else
            {"tasks_per_node": spec.tasks_per_node, "nodes": 1, "timeout_min": spec.time_limit_minutes},
            "rank0_argv": rank0, "script": render_script(spec)}


def submit(request: SubmitRequest, progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Submit a recipe; returns the job id, run dir and how to follow it."""
    import yaml

    from toolkit.job.render import render_script
    from toolkit.recipes.load import find_recipe
    from toolkit.submit import executor as executors

    name_hint = Path(request.recipe).stem
    recipe_file = find_recipe(request.recipe)
    run = rundir.run_dir_path(name_hint if request.profile is None else f"{name_hint}-{request.profile}")
    try:
        recipe, queue, spec, executor, notes = plan(request, run_dir=str(run))
        for note in notes:
            progress(note)
        if executor == "slurm":
            from toolkit.slurm.commands import check_controller

            check_controller()
            executors.preflight(spec)
        rundir.create(run)  # only now: invalid input leaves the runs root untouched
        (run / "recipe.yaml").write_text(yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False))
        (run / "job.sbatch").write_text(render_script(spec))
        meta = {**rundir.base_metadata(recipe.name, recipe_file), "profile": request.profile,
                "overrides": list(request.overrides), "executor": executor, "queue": queue.name,
                "instance_type": queue.instance_type, "nodes": spec.nodes, "ranks_per_node": spec.tasks_per_node,
                "ranks": spec.world_size, "job_ids": []}
        rundir.write_json(run / rundir.METADATA, meta)
        job_id = executors.submit(spec, run, executor)
    except BaseException:
        rundir.discard(run)  # never leave a run dir for a job that was not submitted
        raise
    meta["job_ids"] = [job_id]
    rundir.write_json(run / rundir.METADATA, meta)
    if executor == "slurm":
        _save_batch_script(job_id, run)
    return {"job_id": job_id, "run_dir": str(run), "executor": executor, "queue": queue.name,
            "nodes": spec.nodes, "ranks": spec.world_size,
            "follow": f"hpc jobs logs {job_id} --follow"}


def _save_batch_script(job_id: str, run: Path) -> None:
    """Keep the batch script Slurm stored for the job (what really ran, for reproduction)."""
    from toolkit.slurm import commands

    res = commands.run(["scontrol", "write", "batch_script", job_id, str(run / "batch_script.sh")], check=False)
    if res.returncode != 0:
        (run / "batch_script.sh.missing").write_text(res.stderr or res.stdout)


def wait(job_id: str, run: Path, progress: Callable[[str], None], poll_s: float = 1.0,
         timeout_s: float | None = None) -> dict[str, Any]:
    """Poll until the job ends; report state changes. Returns the final status and, on failure, the culprit."""
    from toolkit.submit import runs

    start, last = time.monotonic(), None
    while True:
        status = runs.status(job_id)
        if status.state not in (last, "UNKNOWN"):  # UNKNOWN: Slurm's accounting has not caught up yet
            progress(f"job {job_id}: {status.state} after {time.monotonic() - start:.0f} s")
            last = status.state
        if status.done:
            break
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            raise HpcError(f"job {job_id} did not finish within {timeout_s:.0f} s (still {status.state})",
                           fix=f"follow it with `hpc jobs status {job_id}`; cancel with `hpc jobs cancel {job_id}`")
        time.sleep(poll_s)
    outcome = {"job_id": job_id, "state": status.state, "run_dir": str(run), "requeues": status.requeues}
    if status.state != "COMPLETED":
        outcome["failed_rank_log"] = failed_rank_log(job_id, run)
    return outcome


def failed_rank_log(job_id: str, run: Path, logs: Path | None = None) -> str | None:
    """The log of the rank that failed first (ranks killed after it by srun --kill-on-bad-exit are not it).

    `logs`: submitit's folder, when not the run's own (a sweep's tasks share the sweep's).
    """
    failures = [rundir.read_json(p) or {} for p in sorted((run / "failures").glob("rank-*.json"))]
    failures = [f for f in failures if "rank" in f]
    if failures:
        first = min(failures, key=lambda f: (f.get("finished_at", ""), f["rank"]))
        rank = first["rank"]
    else:
        rank = 0
    log = (logs or run / "submitit") / f"{job_id}_{rank}_log.err"
    return str(log) if log.exists() else None
