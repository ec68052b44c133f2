"""The run dir: everything needed to reproduce and report on one run.

    <runs root>/<recipe>-<UTC time>-<nonce>/
        metadata.json    toolkit version, recipes' git commit, who/when, job ids, queue, nodes, ranks
        recipe.yaml      the resolved recipe (profile and --set applied)
        job.sbatch       the script `hpc recipes render` makes for the same spec
        batch_script.sh  the batch script Slurm actually stored (scontrol write batch_script)
        submitit/        submitit's pickles and per-rank logs: <job>_<rank>_log.out / .err
        result.json      written by rank 0 when the workload ends (Slurm forgets finished jobs)

The runs root is $HPC_RUNS_DIR, else ~/hpc-runs (home is shared with the compute nodes on ParallelCluster).
"""

from __future__ import annotations

import datetime as dt
import enum
import getpass
import json
import os
import secrets
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

from toolkit.errors import HpcError

class ExecutorKind(enum.StrEnum):
    """How a run was submitted (toolkit.submit.executor): metadata.json's "executor", `--executor`, the plan's."""

    SLURM = "slurm"
    LOCAL = "local"
    SBATCH = "sbatch"

    @classmethod
    def parse(cls, name: str) -> ExecutorKind:
        """A kind by name; also the names run dirs written before this vocabulary recorded."""
        return cls({"submitit-slurm": "slurm", "submitit-local": "local"}.get(name, name))


METADATA = "metadata.json"
RESULT = "result.json"


def runs_root() -> Path:
    return Path(os.environ.get("HPC_RUNS_DIR") or Path.home() / "hpc-runs")


def run_dir_path(recipe_name: str, root: Path | None = None) -> Path:
    """A new run dir's path (not created yet: create() it once the job is known to be valid)."""
    root = root or runs_root()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in recipe_name)[:60] or "run"
    return root / f"{safe}-{stamp}-{secrets.token_hex(3)}"


def create(path: Path) -> Path:
    missing = [p for p in (path, *path.parents) if not p.exists()]
    try:
        path.mkdir(parents=True)
    except OSError as exc:
        raise HpcError(f"cannot create run dir {path}: {exc.strerror}",
                       fix="set HPC_RUNS_DIR to a writable directory shared with the compute nodes") from None
    _created[path] = missing
    return path


_created: dict[Path, list[Path]] = {}  # run dir -> the directories create() made for it (itself first)


def discard(run: Path) -> None:
    """Remove a run dir whose job was never submitted, and the runs root too if create() made it for it."""
    shutil.rmtree(run, ignore_errors=True)
    for parent in _created.pop(run, [])[1:]:
        try:
            parent.rmdir()  # only while empty
        except OSError:
            break


def task_dir_name(index: int, count: int) -> str:
    """A sweep task's run dir, inside the sweep's dir."""
    return f"task-{index:0{max(3, len(str(count - 1)))}d}"


def task_job_id(array_id: str, index: int, count: int) -> str:
    """Slurm's id of one task ("ID_N"; submitit sends a one-point grid as a plain job: "ID")."""
    return f"{array_id}_{index}" if count > 1 else array_id


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def git_commit(path: Path) -> str | None:
    """The commit of the git checkout holding `path` (the recipes), if any; '+dirty' when it has changes."""
    try:
        cwd = path if path.is_dir() else path.parent
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--", str(path)], cwd=cwd, capture_output=True,
                               text=True, timeout=5).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def base_metadata(recipe_name: str, recipe_path: Path | None) -> dict[str, Any]:
    from toolkit import __version__

    return {
        "toolkit_version": __version__,
        "recipe": recipe_name,
        "recipe_file": str(recipe_path) if recipe_path else None,
        "recipes_git_commit": git_commit(recipe_path) if recipe_path else None,
        "submitted_by": getpass.getuser(),
        "submitted_from": socket.gethostname(),
        "submitted_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def find_run(job_id: str, root: Path | None = None) -> Path | None:
    """The run dir whose metadata names this job id (an array task "ID_N" maps to its array's run); a sweep is
    also found by its dir's name."""
    base = job_id.split("_")[0]
    for run in list_runs(root):
        meta = read_json(run / METADATA) or {}
        if base in {str(j) for j in meta.get("job_ids", [])} or (run.name == job_id and meta.get("kind") == "sweep"):
            return run
    return None


def list_runs(root: Path | None = None) -> list[Path]:
    root = root or runs_root()
    if not root.is_dir():
        return []
    return sorted((p.parent for p in root.glob(f"*/{METADATA}")), key=lambda p: p.stat().st_mtime)
