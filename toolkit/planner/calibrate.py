"""`hpc plan calibrate RECIPE`: short runs of the recipe at a few node counts and a collectives run, one after
another (runs side by side would slow each other), through the same submit path as `hpc recipes submit`
(toolkit.submit.submission), then the calibration record (toolkit.planner.calibration) naming them."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from toolkit.errors import HpcError, UsageError

# The flag that caps a run's updates, per launcher kind: our trainer's and fairseq's.
STEP_BUDGET_FLAGS = {"python-module": "--max-steps", "fairseq": "--max-update"}
CALIBRATE_PROFILE = "calibrate"


def calibration_profile(recipe_name: str, profile: str | None) -> str | None:
    """The profile calibration runs use: the one given, else the recipe's `calibrate` profile where it has one."""
    from toolkit.recipes.load import load_recipe

    if profile is not None:
        return profile
    recipe = load_recipe(recipe_name)
    return CALIBRATE_PROFILE if CALIBRATE_PROFILE in recipe.profiles else None


def step_budget_override(recipe_name: str, profile: str | None, steps: int | None) -> list[str]:
    from toolkit.recipes.load import load_recipe

    if steps is None:
        return []
    recipe = load_recipe(recipe_name, profile=profile)
    flag = STEP_BUDGET_FLAGS.get(recipe.launcher.kind)
    if flag is None:
        raise UsageError(f"--steps: hpc does not know the step-limit flag of a {recipe.launcher.kind} launcher",
                         fix="give a profile that keeps the run short (--profile NAME) and leave out --steps")
    return [f"args.{flag}={steps}"]


def calibrate(recipe: str, nodes: Sequence[int], cluster: str | None, queue: str | None, profile: str | None,
              overrides: Sequence[str], steps: int | None, collectives: bool,
              progress: Callable[[str], None]) -> dict:
    """Submit and wait for each calibration run; write the record. Raises HpcError when a run fails."""
    import json

    from toolkit.planner.calibration import write_record
    from toolkit.recipes.load import load_recipe
    from toolkit.slurm.status import State
    from toolkit.submit import submission
    from toolkit.submit.plan import SubmitRequest

    counts = sorted(set(nodes))
    if len(counts) < 2 or counts[0] != 1:
        raise UsageError(f"--nodes {','.join(map(str, nodes))}: calibration needs 1 node and at least one more "
                         "(the fit compares them)", fix="e.g. --nodes 1,2")
    profile = calibration_profile(recipe, profile)
    sets = [*step_budget_override(recipe, profile, steps), *overrides]
    requests = [(n, SubmitRequest(recipe, n, cluster, queue, profile, tuple(sets))) for n in counts]
    if collectives:
        # the collectives recipe on the largest calibration node count, with the training runs' software (their
        # venv, or none): its busbw is what the gradients' all-reduce gets between those nodes
        venv = load_recipe(recipe, profile=profile, overrides=sets).software.venv
        requests.append((counts[-1], SubmitRequest("collectives", counts[-1], cluster, queue,
                                                   "smoke" if _is_cpu(cluster, queue) else None,
                                                   (f"software.venv={json.dumps(venv)}",))))
    training_dirs: list[str] = []
    collective_dirs: list[str] = []
    queue_name = None
    for n, request in requests:
        result = submission.submit(request, progress=progress)
        queue_name = result["queue"]
        progress(f"calibration: {request.recipe} on {n} node(s): job {result['job_id']}, run dir {result['run_dir']}")
        outcome = submission.wait(result["job_id"], Path(result["run_dir"]), progress=progress)
        if outcome["state"] != State.COMPLETED:
            raise HpcError(f"calibration run {result['job_id']} ({request.recipe}, {n} nodes) ended {outcome['state']}",
                           fix=f"see its logs: hpc jobs logs {result['job_id']}")
        (collective_dirs if request.recipe == "collectives" else training_dirs).append(result["run_dir"])
    assert queue_name is not None
    record = write_record(recipe, queue_name, training_dirs, collective_dirs, profile,
                          root=Path(training_dirs[0]).parent)
    return {"recipe": recipe, "queue": queue_name, "profile": profile, "training": training_dirs,
            "collectives": collective_dirs, "record": str(record)}


def _is_cpu(cluster: str | None, queue: str | None) -> bool:
    """A queue without GPUs runs the collectives recipe's smoke profile (host memory, gloo)."""
    from toolkit.cluster.queues import resolve_queue

    found, _ = resolve_queue(cluster, queue)
    return not found.gpus_per_node
