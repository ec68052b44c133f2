"""Where the local test cluster keeps everything, and what it is made of: one state dir, fixed node list.

Pure data, no side effects: discovery, the daemons and the tests all read the same paths from here.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

DEFAULT_STATE_DIR = Path("/var/tmp/hpc-sandbox")
STATE_DIR_ENV = "HPC_SANDBOX_DIR"
CLUSTER_NAME = "sandbox"
DEFAULT_QUEUE = "cpu"

# Ports away from Slurm's defaults (6817-6819) so a stray system Slurm can never receive our traffic.
SLURMCTLD_PORT = 6917
SLURMDBD_PORT = 6919


@dataclasses.dataclass(frozen=True)
class Node:
    name: str
    addr: str
    port: int
    runs_slurmd: bool  # the p3dn nodes only exist for `sbatch --test-only`


# The cpu nodes share this machine's 2 real cores: 2 CPUs each, so 2 ranks x 1 CPU fit on each node.
CPU_NODES = tuple(Node(f"c{i}", f"127.0.1.{10 + i}", 6920 + i, True) for i in (1, 2))
# Named like ParallelCluster names a static compute resource's nodes: {queue}-st-{resource}-N.
P3DN_NODES = tuple(Node(f"p3dn-st-p3dn-24xl-{i}", f"127.0.1.{100 + i}", 6930 + i, False) for i in range(1, 9))
NODES = CPU_NODES + P3DN_NODES
FAKE_GPUS_PER_NODE = 8


def state_dir() -> Path:
    return Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Every path under one state dir."""

    root: Path

    @classmethod
    def current(cls) -> "Layout":
        return cls(state_dir())

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.etc / "gres.conf"

    @property
    def slurmdbd_conf(self) -> Path:
        return self.etc / "slurmdbd.conf"

    @property
    def cluster_config(self) -> Path:
        return self.root / "cluster-config.yaml"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def munge(self) -> Path:
        return self.root / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge / "munge.socket"

    @property
    def munge_key(self) -> Path:
        return self.munge / "munge.key"

    @property
    def mysql(self) -> Path:
        return self.root / "mysql"

    @property
    def mysql_data(self) -> Path:
        return self.mysql / "data"

    @property
    def mysql_socket(self) -> Path:
        return self.mysql / "mysqld.sock"

    @property
    def gpu_devices(self) -> Path:
        return self.root / "dev"

    def pid_file(self, daemon: str, node: str | None = None) -> Path:
        # munged and mariadbd drop root: their pid files live in their own dirs.
        if daemon == "munged":
            return self.munge / "munged.pid"
        if daemon == "mariadbd":
            return self.mysql / "mariadbd.pid"
        return self.run / (f"{daemon}-{node}.pid" if node else f"{daemon}.pid")
