"""Faults made for real on the local cluster's simulated nodes (tests of toolkit.reports.stragglers and
toolkit.node.spares use them).

lost_node: a node lost as a crashed machine is, by SIGKILL to its slurmd, the slurmstepd of each step it runs and
every task, at once; nothing on it answers any more, and Slurm learns of it only at SlurmdTimeout.

missing_mount: a node whose shared file system is missing, as after a failed mount at boot: an empty read-only
file system over a directory in that node's own mount namespace (testbench.cluster starts each slurmd in one), which
every step started there inherits; the other nodes and this machine still see the directory.

slow_node: a node made slow the way a throttled or shared machine is, by a CPU limit on its slurmd and everything
running on it. The simulated nodes are slurmd processes on this one machine; the steps a slurmd starts inherit
its cgroups, and Slurm's task/cgroup plugin moves them in the cpuset, memory and devices hierarchies only, so a
CFS quota on the `cpu` cgroup (cgroup v1, as this machine mounts it) of slurmd and of the node's running tasks
holds every step on the node, running or started later.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Iterator

from testbench import procs
from testbench.layout import Layout

CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000


def node_processes(node: str, layout: Layout | None = None) -> list[str]:
    """The processes running on simulated node `node` of the lane: every task and its children carry
    SLURMD_NODENAME=node (slurmstepd detaches from slurmd, so they are not slurmd's descendants). Lanes share
    node names (c1, c2 are in the default lane and the node lane), so a task counts only where the slurmstepd it
    runs under shares this lane's slurmd's mount namespace (each slurmd is started in one of its own): a fault on
    one lane's c2 never reaches another lane's jobs, which run beside it under `make test`'s workers."""
    layout = layout or Layout.current()
    slurmd_ns = _mount_ns(int(layout.pid_file("slurmd", node).read_text().strip()))
    marker = f"SLURMD_NODENAME={node}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            if marker in environ.read_bytes().split(b"\0"):
                stepd = _stepd_of(int(environ.parent.name))
                if stepd is not None and slurmd_ns is not None and _mount_ns(stepd) == slurmd_ns:
                    found.append(environ.parent.name)
    return found


def _mount_ns(pid: int) -> str | None:
    with contextlib.suppress(OSError):
        return os.readlink(f"/proc/{pid}/ns/mnt")
    return None


def _stepd_of(pid: int) -> int | None:
    """The slurmstepd that `pid` runs under (itself, or its nearest such ancestor), or None."""
    current: int | None = pid
    for _ in range(64):
        if current is None or current <= 1:
            return None
        if procs.comm(current) == "slurmstepd":
            return current
        current = _parent(current)
    return None


@contextlib.contextmanager
def slow_node(node: str, cpu_fraction: float, layout: Layout | None = None) -> Iterator[Path]:
    """Limit node `node` (its slurmd, the steps it runs and every step it starts from now on) to `cpu_fraction`
    of one CPU in all; undone on exit (every process back in the root cgroup, the limited cgroup removed)."""
    layout = layout or Layout.current()
    if not (CPU_CGROUP / "cgroup.procs").exists():
        raise RuntimeError(f"no cgroup v1 cpu hierarchy at {CPU_CGROUP}: this machine cannot limit a node's CPU")
    pid = layout.pid_file("slurmd", node).read_text().strip()
    group = CPU_CGROUP / f"hpc-slow-{node}"
    group.mkdir(exist_ok=True)
    (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
    (group / "cpu.cfs_quota_us").write_text(str(int(PERIOD_US * cpu_fraction)))
    for member in (pid, *node_processes(node, layout)):
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            (group / "cgroup.procs").write_text(member)
    try:
        yield group
    finally:
        for left in (group / "cgroup.procs").read_text().split():  # slurmd, and what still runs under it
            with contextlib.suppress(OSError):
                (CPU_CGROUP / "cgroup.procs").write_text(left)
        with contextlib.suppress(OSError):
            group.rmdir()


@contextlib.contextmanager
def missing_mount(node: str, directory: Path, layout: Layout | None = None) -> Iterator[None]:
    """Hide `directory` from node `node`'s steps (module docstring); undone on exit."""
    layout = layout or Layout.current()
    pid = layout.pid_file("slurmd", node).read_text().strip()
    # A node lane's slurmd runs chrooted into its own root file system: -r takes its root, so `directory` is the
    # path its steps see (and `mount` is that root's own)
    enter = ["nsenter", "-t", pid, "-m", *(["-r"] if layout.lane.rootfs_nodes_only else [])]
    subprocess.run([*enter, "mount", "-t", "tmpfs", "-o", "ro,size=1m", "hpc-missing", str(directory)], check=True,
                   capture_output=True, timeout=30)
    try:
        yield
    finally:
        subprocess.run([*enter, "umount", "-l", str(directory)], check=False, capture_output=True, timeout=30)


def lost_node(node: str, layout: Layout | None = None) -> list[int]:
    """Kill simulated node `node` for real (module docstring); returns the pids killed."""
    layout = layout or Layout.current()
    tasks = [int(pid) for pid in node_processes(node, layout)]
    stepds = {parent for parent in map(_parent, tasks) if parent and procs.comm(parent) == "slurmstepd"}
    slurmd = int(layout.pid_file("slurmd", node).read_text().strip())
    killed = []
    for pid in (slurmd, *stepds, *tasks):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


def restore_node(node: str, layout: Layout | None = None) -> None:
    """Bring a lost node back into service with a slurmd again. Down first: that ends a job left completing on the
    node, which waits for an answer from the killed slurmstepd that a new slurmd never gives."""
    from testbench import cluster

    layout = layout or Layout.current()

    def update(*words: str) -> None:
        subprocess.run(["scontrol", "update", f"NodeName={node}", *words], env=cluster.slurm_env(layout),
                       capture_output=True, check=False, timeout=30)

    update("State=DOWN", "Reason=testbench: restoring after a fault")
    update("State=RESUME")  # idle once its slurmd (started by `up` where it is gone) answers
    cluster.up(layout)
    procs.wait_for(lambda: cluster.node_states(layout).get(node) in ("idle", "mix", "alloc"), 60,
                   f"node {node} back in service", interval=0.5)


def _parent(pid: int) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return None
