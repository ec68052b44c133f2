"""Is the local test cluster up, and where is its config? Cheap: file and /proc reads, no subprocess."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from testbench import procs
from testbench.layout import DEFAULT_LANE, DEFAULT_QUEUE, Layout
from toolkit.cluster.queues import CLUSTER_CONFIG_ENV

RUNS_DIR_ENV = "HPC_RUNS_DIR"  # the toolkit's runs root (toolkit.rundir.runs_root)
RUNS_SUBDIR = "hpc-runs"


@dataclasses.dataclass(frozen=True)
class Sandbox:
    state_dir: Path
    slurm_conf: Path  # what SLURM_CONF must name for sbatch/squeue/sacct/submitit to reach it
    cluster_config: Path  # ParallelCluster v3 YAML describing its queues (cpu, p3dn)
    default_queue: str = DEFAULT_QUEUE
    slurm: str = DEFAULT_LANE.slurm  # the lane's Slurm version
    bin_dir: Path | None = None  # a chroot lane's client commands: first on PATH to reach it
    # The node lane's shared dir as both this machine and its nodes see it (/fsx): run dirs must be on it.
    shared_dir: Path | None = None

    @property
    def runs_dir(self) -> Path | None:
        """The runs root (HPC_RUNS_DIR) on the shared dir, for a lane whose nodes see nothing else of this machine."""
        return None if self.shared_dir is None else self.shared_dir / RUNS_SUBDIR

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """BASE (default: this process's environment) pointed at this cluster the way a real cluster's users
        point their tools: Slurm's SLURM_CONF, hpc's HPC_CLUSTER_CONFIG, and for a chroot lane its client
        commands first on PATH; for the node lane HPC_RUNS_DIR on its shared dir, as run dirs must be where the
        nodes see them."""
        env = dict(os.environ if base is None else base, SLURM_CONF=str(self.slurm_conf))
        env[CLUSTER_CONFIG_ENV] = str(self.cluster_config)
        if self.bin_dir is not None:
            env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        if self.runs_dir is not None:
            env[RUNS_DIR_ENV] = str(self.runs_dir)
        return env


def discover(layout: Layout | None = None) -> Sandbox | None:
    """The sandbox if its slurmctld runs (state dir from HPC_SANDBOX_DIR or the default), else None."""
    layout = layout or Layout.current()
    if not layout.slurm_conf.is_file() or not layout.cluster_config.is_file():
        return None
    if procs.running_pid(layout.pid_file("slurmctld"), layout.lane.comm("slurmctld")) is None:
        return None
    if layout.lane.rootfs_nodes_only:
        from testbench.cluster import shared_path

        return Sandbox(layout.root, layout.slurm_conf, layout.cluster_config, slurm=layout.lane.slurm,
                       bin_dir=layout.bin, shared_dir=shared_path(layout))
    return Sandbox(layout.root, layout.slurm_conf, layout.cluster_config, slurm=layout.lane.slurm,
                   bin_dir=layout.bin if layout.lane.rootfs is not None else None)
