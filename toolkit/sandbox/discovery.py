"""Is the local test cluster up, and where is its config? Cheap: file and /proc reads, no subprocess."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from toolkit.sandbox import procs
from toolkit.sandbox.layout import DEFAULT_QUEUE, Layout


@dataclasses.dataclass(frozen=True)
class Sandbox:
    state_dir: Path
    slurm_conf: Path  # what SLURM_CONF must name for sbatch/squeue/sacct/submitit to reach it
    cluster_config: Path  # ParallelCluster v3 YAML describing its queues (cpu, p3dn)
    default_queue: str = DEFAULT_QUEUE


def discover(layout: Layout | None = None) -> Sandbox | None:
    """The sandbox if its slurmctld runs (state dir from HPC_SANDBOX_DIR or the default), else None."""
    layout = layout or Layout.current()
    if not layout.slurm_conf.is_file() or not layout.cluster_config.is_file():
        return None
    if procs.running_pid(layout.pid_file("slurmctld"), "slurmctld") is None:
        return None
    return Sandbox(layout.root, layout.slurm_conf, layout.cluster_config)


def use(sandbox: Sandbox | None = None) -> Sandbox | None:
    """Point this process (and the Slurm commands it starts) at the sandbox: sets SLURM_CONF.

    With no argument it discovers one; returns the sandbox used, or None (environment untouched).
    """
    sandbox = sandbox or discover()
    if sandbox is not None:
        os.environ["SLURM_CONF"] = str(sandbox.slurm_conf)
    return sandbox
