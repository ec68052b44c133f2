"""Where the local test cluster keeps everything, and what it is made of: one state dir, fixed node list.

Three lanes can run at once: this machine's own Slurm (Debian bookworm's 22.05) and newer ones (trixie's 24.11,
forky's 26.05) run from Debian root file systems under chroot, each with its own state dir, ports, node addresses
and munge. A fourth, the container lane (22.05-pyxis), is this machine's Slurm again with NVIDIA pyxis loaded and
an enroot per node (testbench.containers), apart from the default lane the same way. A fifth, the node lane
(bullseye), has compute nodes unlike the submitter (testbench.chroot.node_enter_script): this machine's Slurm
22.05 controller and clients (but srun, testbench.chroot.NODE_LANE_CLIENTS), and slurmd 20.11 nodes in Debian
bullseye's root file system (python3 3.9) that share only one directory with this machine, seen at /fsx as
ParallelCluster's nodes see their shared file system.
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
# Sixteen more nodes (2 CPUs each, all on this machine's 2 cores) for what needs many nodes (the bad-node search,
# toolkit.health.nodesearch), in a partition
# of their own so that every other job keeps the two cpu nodes. Only on this machine's Slurm (the default lane).
WIDE_NODES = tuple(Node(f"w{i}", f"127.0.1.{40 + i}", 6940 + i, True) for i in range(1, 17))
NODES = CPU_NODES + P3DN_NODES + WIDE_NODES
FAKE_GPUS_PER_NODE = 8




@dataclasses.dataclass(frozen=True)
class Lane:
    """One Slurm version of the local test cluster."""

    slurm: str  # the Slurm major version it runs, e.g. "24.11"
    state_dir: Path
    slurmctld_port: int
    slurmdbd_port: int
    cpu_nodes: tuple[Node, ...]
    p3dn_nodes: tuple[Node, ...]
    accounting: bool  # slurmdbd + MariaDB (sacct works); without it status falls back to squeue/scontrol
    suite: str | None = None  # Debian suite of its root file system; None: this machine's own packages
    rootfs: Path | None = None
    # Test payloads derive ports from job ids (all nodes share one network): lanes number jobs apart.
    first_job_id: int | None = None
    containers: bool = False  # pyxis in its plugstack.conf, an enroot per node (testbench.containers)
    wide_nodes: tuple[Node, ...] = ()  # the `wide` partition's nodes (WIDE_NODES)
    # Only the slurmd nodes (and so their jobs) run in the root file system; munge, the controller and the
    # clients are this machine's own, as a login node's are not its compute nodes' (the node lane).
    rootfs_nodes_only: bool = False
    shared_dir: Path | None = None  # the one host dir the nodes see (at SHARED_MOUNT and at this path)

    @property
    def nodes(self) -> tuple[Node, ...]:
        return self.cpu_nodes + self.p3dn_nodes + self.wide_nodes

    @property
    def slurmd_nodes(self) -> tuple[Node, ...]:
        """The nodes that run a slurmd here (the p3dn ones only exist for `sbatch --test-only`)."""
        return self.cpu_nodes + self.wide_nodes

    def comm(self, daemon: str) -> str:
        """The process name its daemon runs under. A chroot lane's daemons carry the version (through a
        symlink: the kernel names a process after the path it was started from) so that neither lane takes
        the other's daemons for a foreign Slurm. At most 15 characters: the kernel truncates longer names."""
        if self.containers:  # the machine's own daemons again, under names the default lane does not guard
            return f"{daemon}-pyxis"[:15]
        if self.rootfs_nodes_only:  # the Slurm version is the machine's own: the suite tells the lane apart
            return f"{daemon}-{self.suite}"[:15]
        return daemon if self.rootfs is None else f"{daemon}-{self.slurm}"[:15]


LANES = {
    "22.05": Lane("22.05", DEFAULT_STATE_DIR, SLURMCTLD_PORT, SLURMDBD_PORT, CPU_NODES, P3DN_NODES, True,
                  wide_nodes=WIDE_NODES),
    # Ports 7017+ and 127.0.2.x: both lanes run at once. No accounting, like ParallelCluster's default (and
    # trixie's slurmdbd 24.11.5 dies on trixie's MariaDB 11.8: "_check_mysql_concat_is_sane: null result",
    # client error 5027, seen Nov 2026).
    "24.11": Lane("24.11", Path("/var/tmp/hpc-sandbox-24.11"), 7017, 7019,
                  tuple(Node(n.name, n.addr.replace("127.0.1.", "127.0.2."), n.port + 100, True) for n in CPU_NODES),
                  tuple(Node(n.name, n.addr.replace("127.0.1.", "127.0.2."), n.port + 100, False)
                        for n in P3DN_NODES),
                  False, "trixie", Path("/var/tmp/hpc-rootfs-trixie"), 10000),
    # The newest Debian has (forky's 26.05.5, Nov 2026): with 22.05 and 24.11 it brackets ParallelCluster
    # 3.16's 25.11. Ports 7117+ and 127.0.3.x, no accounting, its own job ids.
    "26.05": Lane("26.05", Path("/var/tmp/hpc-sandbox-26.05"), 7117, 7119,
                  tuple(Node(n.name, n.addr.replace("127.0.1.", "127.0.3."), n.port + 200, True) for n in CPU_NODES),
                  tuple(Node(n.name, n.addr.replace("127.0.1.", "127.0.3."), n.port + 200, False)
                        for n in P3DN_NODES),
                  False, "forky", Path("/var/tmp/hpc-rootfs-forky"), 20000),
}
DEFAULT_LANE = LANES["22.05"]
# The container lane, beside the version lanes (not one of them: the same Slurm as the default lane). Ports 7217+
# and 127.0.4.x, no accounting (like ParallelCluster's default), its own job ids.
CONTAINER_LANES = {
    "22.05-pyxis": Lane("22.05", Path("/var/tmp/hpc-sandbox-pyxis"), 7217, 7219,
                        tuple(Node(n.name, n.addr.replace("127.0.1.", "127.0.4."), n.port + 300, True)
                              for n in CPU_NODES),
                        tuple(Node(n.name, n.addr.replace("127.0.1.", "127.0.4."), n.port + 300, False)
                              for n in P3DN_NODES),
                        False, first_job_id=30000, containers=True),
}

# Where the node lane's nodes see their shared directory: ParallelCluster's usual FSx for Lustre mount point.
SHARED_MOUNT = Path("/fsx")
NODE_LANE_STATE_DIR = Path("/var/tmp/hpc-sandbox-bullseye")
# The node lane: nodes unlike the submitter (python3 3.9, nothing of this machine but /fsx). Three nodes: the
# spares tests need one node and a spare, the pre-flight's a node to fail besides. Ports 7317+ and 127.0.5.x, no
# accounting, its own job ids. Its controller is this machine's 22.05: Slurm accepts daemons two major releases
# older than the controller (22.05 -> 21.08, 20.11), as during a rolling upgrade.
NODE_LANES = {
    "bullseye": Lane("22.05", NODE_LANE_STATE_DIR, 7317, 7319,
                     tuple(Node(f"c{i}", f"127.0.5.{10 + i}", 7320 + i, True) for i in (1, 2, 3)),
                     tuple(Node(n.name, n.addr.replace("127.0.1.", "127.0.5."), n.port + 400, False)
                           for n in P3DN_NODES),
                     False, "bullseye", Path("/var/tmp/hpc-rootfs-bullseye"), 40000,
                     rootfs_nodes_only=True, shared_dir=NODE_LANE_STATE_DIR / "fsx"),
}


def state_dir() -> Path:
    return Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def lane(slurm: str | None) -> Lane:
    """The lane for a Slurm version (None: this machine's own Slurm)."""
    if slurm is None:
        return DEFAULT_LANE
    known = {**LANES, **CONTAINER_LANES, **NODE_LANES}
    if slurm not in known:
        from toolkit.errors import UsageError

        raise UsageError(f"no local Slurm {slurm!r}", fix=f"pick one of: {', '.join(known)}")
    return known[slurm]


@dataclasses.dataclass(frozen=True)
class Layout:
    """Every path under one state dir."""

    root: Path
    lane: Lane = DEFAULT_LANE

    @classmethod
    def current(cls, slurm: str | None = None) -> "Layout":
        """The default lane's state dir comes from HPC_SANDBOX_DIR (tests isolate with it); others are fixed."""
        chosen = lane(slurm)
        return cls(state_dir() if chosen is DEFAULT_LANE else chosen.state_dir, chosen)

    @property
    def bin(self) -> Path:
        """A chroot lane's client commands (sbatch, srun, ...) as wrappers: put first on PATH to use it."""
        return self.root / "bin"

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
    def cgroup_conf(self) -> Path:
        return self.etc / "cgroup.conf"

    @property
    def slurmdbd_conf(self) -> Path:
        return self.etc / "slurmdbd.conf"

    @property
    def cluster_config(self) -> Path:
        return self.root / "cluster-config.yaml"

    @property
    def plugstack_conf(self) -> Path:
        return self.etc / "plugstack.conf"

    @property
    def sbin(self) -> Path:
        """The container lane's daemon names (symlinks to this machine's daemons, named as Lane.comm says)."""
        return self.root / "sbin"

    @property
    def node_enter(self) -> Path:
        """The node lane's script that runs a command on one of its nodes (testbench.chroot.node_enter_script)."""
        return self.sbin / "enter-node"

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
