"""Where new run dirs go by default, and when that place is refused for checkpoints.

$HPC_RUNS_DIR (or --run-dir) always wins. Otherwise a job planned on a cluster config with an FSx for Lustre
(SharedStorage, StorageType FsxLustre) gets <FSx mount>/hpc-runs/<user>, and anything else ~/hpc-runs. On
ParallelCluster home is exported from the head node's root EBS volume (the AMI's size unless HeadNode/LocalStorage/
RootVolume/Size says otherwise), which also holds slurmctld's state: a full one stops the scheduler. So there:

  - a checkpointing job (resources.requeue with a checkpoints dir inside its run dir) gets a one-line warning;
  - a sweep of more than MAX_HOME_CHECKPOINT_POINTS such points is refused: every point keeps its own
    checkpoints in its task's run dir (toolkit.submit.sweep): recipes/roberta.yaml (roberta_large, 355M parameters)
    keeps checkpoint_last.pt and the last two update checkpoints, each ~4 GB with fp32 weights and Adam's two
    moments (12 bytes a parameter), ~13 GB a point: two points already fill most of a ~40 GB root volume.

Readers (`hpc jobs ...`) look in every default root (reader_roots): runs submitted before the FSx default, or
without a cluster config, stay found.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Literal, Sequence

from toolkit import rundir
from toolkit.errors import HpcError

MAX_HOME_CHECKPOINT_POINTS = 1  # checkpointing points a sweep may keep on the head node's root volume: one job's worth


@dataclasses.dataclass(frozen=True)
class RunsRoot:
    path: Path
    source: Literal["env", "fsx", "home"]  # $HPC_RUNS_DIR, the cluster config's FSx, ~/hpc-runs


def choose(queue: Any) -> RunsRoot:
    """The runs root for a job on `queue` (toolkit.cluster.queues.Queue). The FSx counts only where it was read
    from a cluster config: default_queue() merely assumes one."""
    if os.environ.get(rundir.RUNS_DIR_ENV):
        return RunsRoot(rundir.runs_root(), "env")
    mount = queue.fsx_mount if queue.from_config else None
    return RunsRoot(rundir.runs_root(mount), "fsx" if mount else "home")


def this_cluster_fsx() -> str | None:
    """The FSx mount of this cluster's config (cluster_config_candidates), if any; None when there is no config
    or it cannot be read (a reader then looks in home only)."""
    from toolkit.cluster.queues import cluster_config_candidates, load_queues

    path = next((p for p in cluster_config_candidates() if p.is_file()), None)
    if path is None:
        return None
    try:
        queues = load_queues(path)
    except HpcError:
        return None
    return next((q.fsx_mount for q in queues.values() if q.fsx_mount), None)


def reader_roots() -> list[Path]:
    """Where `hpc jobs` looks for run dirs: $HPC_RUNS_DIR alone, else this cluster's FSx root and home's."""
    if os.environ.get(rundir.RUNS_DIR_ENV):
        return [rundir.runs_root()]
    mount = this_cluster_fsx()
    if not mount:
        return [rundir.home_runs_root()]
    try:
        return [rundir.shared_runs_root(mount), rundir.home_runs_root()]
    except HpcError:  # no home here: the FSx root alone
        return [rundir.shared_runs_root(mount)]


def checkpoints_in_run_dir(spec: Any) -> bool:
    """A checkpointing job (requeue on, a checkpoints dir) whose checkpoints land inside its run dir."""
    checkpoints = spec.dirs.get("checkpoints")
    return bool(spec.requeue and checkpoints and Path(checkpoints).is_relative_to(spec.run_dir))


HOME_FIX = (f"set {rundir.RUNS_DIR_ENV} to a shared file system with room (e.g. {rundir.RUNS_DIR_ENV}=/fsx/"
            "hpc-runs/$USER), or add an FSx for Lustre to the cluster config (SharedStorage: runs then go there)")


def home_warning(root: RunsRoot, spec: Any) -> str | None:
    """One line for a checkpointing job whose run dir defaults to home (the head node's root volume)."""
    if root.source != "home" or not checkpoints_in_run_dir(spec):
        return None
    return (f"checkpoints go to {spec.dirs['checkpoints']}, on the head node's root volume (no FSx in the cluster "
            f"config): {HOME_FIX}")


def refuse_home_sweep(root: RunsRoot, specs: Sequence[Any]) -> str | None:
    """A sweep of more than MAX_HOME_CHECKPOINT_POINTS checkpointing points on home is refused; a smaller one
    gets home_warning's line (returned)."""
    points = sum(checkpoints_in_run_dir(s) for s in specs)
    if root.source != "home" or not points:
        return None
    if points > MAX_HOME_CHECKPOINT_POINTS:
        raise HpcError(f"this sweep would keep {points} points' checkpoints under {root.path}, on the head node's "
                       f"root volume (slurmctld's state is there too): at most {MAX_HOME_CHECKPOINT_POINTS} may go "
                       "there", fix=HOME_FIX)
    return home_warning(root, specs[0])
