"""A run owns its outputs. Checkpoints and logs are under each run's own dir by default (toolkit.recipes.schema:
dir_under), so a second submission of a recipe never continues the first (a trainer restores whatever
last checkpoint its checkpoint dir holds). Continuing another run is explicit: `--resume-from RUN_DIR|JOB_ID`
seeds this run's checkpoints dir with that run's, once, before the ranks start (a requeue of this job then resumes
its own). A recipe that pins an output dir across runs (`under: root`, or an absolute dir) is warned about when
another run already wrote there, naming that run."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from toolkit import rundir
from toolkit.errors import UsageError

CHECKPOINTS_DIR = "checkpoints dir"  # the plan's derived key (toolkit.job.spec.dirs), as plan.json records it


def recorded_dirs(run: rundir.RunDir) -> dict[str, str]:
    """A run's output dirs as its plan recorded them ("checkpoints dir" -> path), {} for a run without a plan."""
    return {d["key"]: d["value"] for d in run.derived() if str(d.get("key", "")).endswith(" dir")}


def find_source(which: str, roots: list[Path]) -> rundir.RunDir:
    """The run `--resume-from` names: a run dir's path, or a job id in the runs roots."""
    path = Path(which).expanduser()
    if path.is_dir() and (path / rundir.METADATA).is_file():
        return rundir.RunDir(path.absolute())
    run = rundir.find_run(which, roots)
    if run is None:
        raise UsageError(f"--resume-from {which}: no run dir of that path, and no run of that job id in "
                         f"{', '.join(str(r) for r in roots)}",
                         fix="give the run dir (`hpc jobs status JOB_ID` shows it) or the job id of a run here")
    return run


def resume_from(spec: Any, which: str, roots: list[Path]) -> Any:
    """The spec, its checkpoints dir seeded from run `which`'s (toolkit.slurm.render writes the copy)."""
    from toolkit.job.scaling import Derived

    mine = spec.dirs.get("checkpoints")
    if not mine:
        raise UsageError(f"--resume-from {which}: recipe {spec.recipe} sets no checkpoints dir to continue in",
                         fix="set dirs.checkpoints in the recipe (e.g. --set dirs.checkpoints.dir=checkpoints)")
    source = find_source(which, roots)
    theirs = recorded_dirs(source).get(CHECKPOINTS_DIR)
    if not theirs:
        raise UsageError(f"--resume-from {which}: run {source.path} recorded no checkpoints dir",
                         fix="resume from a run of a recipe that checkpoints (its plan.json lists a checkpoints dir)")
    if theirs == mine:
        raise UsageError(f"--resume-from {which}: that run's checkpoints dir {theirs} is this run's own",
                         fix="drop --resume-from: this run continues in that dir as it is")
    why = f"--resume-from: run {source.name}'s checkpoints seed this run's, once (a requeue resumes its own)"
    return dataclasses.replace(spec, resume_from=theirs, derived=(*spec.derived, Derived("resume from", theirs, why)))


def shared_output_warnings(spec: Any, roots: list[Path]) -> list[str]:
    """An output dir of this job that another run's plan also names: this job would continue (or overwrite) it."""
    from toolkit.recipes.schema import OUTPUT_DIRS

    mine = {f"{name} dir": path for name in OUTPUT_DIRS if (path := spec.dirs.get(name))
            and not Path(path).is_relative_to(spec.run_dir)}
    if not mine:
        return []
    warnings = []
    for run in rundir.list_runs(roots):
        theirs = recorded_dirs(run)
        for key, path in mine.items():
            if theirs.get(key) == path and str(run.path) != spec.run_dir:
                job = ", ".join((run.metadata() or rundir.Metadata()).job_ids) or "not submitted"
                warnings.append(f"{key.removesuffix(' dir')} dir {path} is also run {run.name}'s (job {job}): this "
                                f"run continues from what it left there; to start fresh, drop `under: root` (or the "
                                f"absolute dir) so the run keeps its own, or --resume-from {run.name} to say so")
        if len(warnings) >= len(mine):
            break
    return warnings
