"""A multi-node job reads its script, software and data on every node: warn when one of them lies outside the
cluster's shared file systems, where only the submitting host has it.

Shared on ParallelCluster: every SharedStorage MountDir of the cluster config (FSx for Lustre, EFS, EBS and RAID
volumes: the head node exports the last two over NFS), and /home, which the head node exports over NFS to the
compute and login nodes unless a shared storage is mounted there (aws/aws-parallelcluster-cookbook,
cookbooks/aws-parallelcluster-environment/recipes/config/export_home.rb and mount_home.rb). Without a cluster
config (a self-managed Slurm, the built-in default queue) the file systems are unknown and nothing is said.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath
from typing import Any

HOME = "/home"  # ParallelCluster's NFS export from the head node


def shared_mounts(queue: Any) -> list[str]:
    """The directories every node of the queue's cluster sees alike (toolkit.cluster.queues.Queue)."""
    mounts = list(queue.shared_mounts) or ([queue.fsx_mount] if queue.fsx_mount else [])
    return list(dict.fromkeys([*mounts, HOME]))


def job_paths(recipe: Any, spec: Any) -> list[tuple[str, str]]:
    """(what, absolute path) of each thing the job's nodes read from the file system: the training script, the
    virtual environment or conda install, a squashfs container image, the data dir."""
    from toolkit.launchers.base import under

    software = spec.software
    found = []
    if recipe.launcher.script:
        found.append(("script", under(spec.root, recipe.launcher.script)))
    found += [(what, path) for what, path in (("venv", software.venv), ("conda", software.conda_root)) if path]
    if software.container and software.container.image.startswith("/"):
        found.append(("container image", software.container.image))
    if spec.dirs.get("data"):
        found.append(("data dir", spec.dirs["data"]))
    # a URL (s3://...) is no file-system path: the job fetches it itself
    return [(what, os.path.normpath(os.path.abspath(path))) for what, path in found if "://" not in path]


def outside_warnings(recipe: Any, spec: Any, queue: Any) -> list[str]:
    """One line per path of a multi-node job (spares count: the job restarts on them) outside every shared
    mount of the queue's cluster config."""
    if not queue.from_config or spec.nodes + spec.spares < 2:
        return []
    mounts = shared_mounts(queue)
    warnings = []
    for what, path in job_paths(recipe, spec):
        if not any(PurePosixPath(path).is_relative_to(mount) for mount in mounts):
            warnings.append(f"{what} {path} is outside the cluster's shared file systems ({', '.join(mounts)}): "
                            f"the job's other nodes cannot read it; move it under one of them")
    return warnings
