"""Running a chroot lane's programs: one `enter` script (private mounts, then chroot) used by the daemons and
by the client wrappers (sbatch, srun, ...) that a user or test puts first on PATH. The node lane's nodes enter
their root file system through a script of their own (node_enter_script), which binds far less.

Every call gets its own mount namespace, so nothing stays mounted on the host: the binds vanish with the last
process inside. Jobs run inside the root file system too (slurmd starts them there), so what they need from
the host is bound in at the same path: the checkout, the venv and its base Python, /tmp, /var/tmp (state
dirs, run dirs), /root and /home. Host Python runs there: it needs only glibc, and trixie's is newer.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from testbench.layout import Layout

MARKER = "etc/hpc-lane"  # inside the root file system: wrappers called from a job run the program directly
CLIENTS = ("sbatch", "srun", "salloc", "squeue", "scontrol", "sacct", "sinfo", "scancel", "sstat", "sacctmgr")
DAEMONS = {"munged": "/usr/sbin/munged", "slurmctld": "/usr/sbin/slurmctld", "slurmd": "/usr/sbin/slurmd",
           "slurmdbd": "/usr/sbin/slurmdbd"}
BASE_BINDS = ("/dev", "/sys", "/tmp", "/var/tmp", "/root", "/home", "/work")


SYSTEM_PREFIXES = (Path("/usr"), Path("/usr/local"))


def python_paths() -> list[Path]:
    """What this Python needs inside the root file system to run jobs there (submitit starts ranks with it):
    its prefixes, or for a system Python (under /usr, which the root file system has its own of) the
    interpreter, its standard library and libpython, bound one by one."""
    import sysconfig

    if Path(sys.base_prefix) not in SYSTEM_PREFIXES:
        return [Path(sys.prefix), Path(sys.base_prefix)]
    paths = [Path(sys.prefix), Path(getattr(sys, "_base_executable", sys.executable)).resolve(),
             Path(sysconfig.get_paths()["stdlib"])]
    libpython = Path(sysconfig.get_config_var("LIBDIR") or "/") / (sysconfig.get_config_var("LDLIBRARY") or "")
    if libpython.suffix != ".a" and libpython.is_file():
        paths.append(libpython.resolve())
    return [p for p in paths if p not in SYSTEM_PREFIXES]


def binds() -> list[str]:
    """Host paths bound into the root file system: the base set plus where this toolkit and its Python live,
    minus what lies under another bind (or does not exist)."""
    import toolkit

    extra = [Path(toolkit.__file__).resolve().parents[1], *python_paths()]
    chosen: list[Path] = []
    for path in [*map(Path, BASE_BINDS), *extra]:
        if path.exists() and not any(path == c or c in path.parents for c in chosen):
            chosen.append(path)
    return [str(p) for p in chosen]


def lane_flag(layout: Layout) -> str:
    """What `--slurm` names the lane by: its Slurm version; the node lane its suite."""
    return (layout.lane.suite or "") if layout.lane.rootfs_nodes_only else layout.lane.slurm


def _whose(layout: Layout) -> str:
    return f"{layout.lane.suite}'s" if layout.lane.rootfs_nodes_only else f"Slurm {layout.lane.slurm}'s"


def _shared_mount_lines(layout: Layout) -> str:
    """Shell lines (inside the enter scripts) that show the node lane's shared dir at SHARED_MOUNT."""
    from testbench.layout import SHARED_MOUNT

    target = '"$root"' + shlex.quote(str(SHARED_MOUNT))
    return f"  mkdir -p {target}\n  mount --bind {shlex.quote(str(layout.lane.shared_dir))} {target}\n"


def _private_root_lines(layout: Layout) -> str:
    """The node lane's submit side shares its root file system with the nodes, so the mount points its binds need
    (the checkout, the venv, /work) must not be made there: the nodes would see them as empty dirs at this
    machine's paths (CI's clone at /check/work/main was seen that way). It enters an overlay of the root file
    system instead, its writes on a tmpfs that goes with the mount namespace. Other lanes' roots are their own."""
    if not layout.lane.rootfs_nodes_only:
        return ""
    return """  scratch="$root/mnt"
  mount -t tmpfs -o mode=0755 tmpfs "$scratch"
  mkdir "$scratch/upper" "$scratch/work" "$scratch/root"
  mount -t overlay overlay -o lowerdir="$root",upperdir="$scratch/upper",workdir="$scratch/work" "$scratch/root" \\
    || { echo "testbench: the node lane needs overlayfs for its submit side (modprobe overlay)" >&2; exit 2; }
  root="$scratch/root"
"""


# Top-level dirs of a Debian root file system (debootstrap's, the merged-/usr links included): any other empty
# one in the node lane's root was a mount point left by an earlier submit side (before _private_root_lines).
ROOTFS_OWN_TOP = frozenset({"bin", "boot", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "media",
                            "mnt", "opt", "proc", "root", "run", "sbin", "srv", "sys", "tmp", "usr", "var"})


def remove_stale_mount_points(root: Path) -> list[Path]:
    """Remove top-level dirs of ROOT that debootstrap did not make and that hold nothing but empty dirs;
    return them."""
    from testbench.layout import SHARED_MOUNT

    removed = []
    for entry in sorted(root.iterdir()):
        # the shared dir's mount point is the nodes' own (node_enter_script makes it)
        own = entry.name in ROOTFS_OWN_TOP or entry.name == SHARED_MOUNT.parts[1]
        if own or entry.is_symlink() or not entry.is_dir():
            continue
        tree = [entry, *entry.rglob("*")]
        if all(p.is_dir() and not p.is_symlink() for p in tree):
            for p in sorted(tree, key=lambda q: len(q.parts), reverse=True):
                p.rmdir()
            removed.append(entry)
    return removed


def enter_script(layout: Layout) -> str:
    root = shlex.quote(str(layout.lane.rootfs))
    dirs = " ".join(shlex.quote(d) for d in binds())
    # The node lane's submit side sees its shared dir where the nodes and this machine do (this machine's /fsx
    # symlink would point into nothing inside the root file system).
    shared = "" if layout.lane.shared_dir is None else _shared_mount_lines(layout)
    # HPC_LANE_HOSTNAME: a node's own UTS namespace, so `hostname` inside its jobs says the node's name.
    return f"""#!/bin/sh
# Written by `python -m testbench up --slurm {lane_flag(layout)}`: run a command inside {_whose(layout)} root \
file system.
set -e
exec unshare --mount --propagation private ${{HPC_LANE_HOSTNAME:+--uts}} -- /bin/sh -c '
  set -e
  root="$1"; shift
{_private_root_lines(layout)}  mount -t proc proc "$root/proc"
  for d in {dirs}; do
    if [ -d "$d" ]; then mkdir -p "$root$d"; else mkdir -p "$(dirname "$root$d")"; touch "$root$d"; fi
    mount --rbind "$d" "$root$d"
  done
{shared}  if [ -n "$HPC_LANE_HOSTNAME" ]; then hostname "$HPC_LANE_HOSTNAME"; fi
  exec chroot "$root" /bin/sh -c "cd \\"\\$1\\" 2>/dev/null || cd /; shift; exec \\"\\$@\\"" sh "$PWD" "$@"
' sh {root} "$@"
"""


def wrapper_script(layout: Layout, program: str) -> str:
    real = f"/usr/bin/{program}"
    return f"""#!/bin/sh
# Written by `python -m testbench up --slurm {lane_flag(layout)}`: {_whose(layout)} `{program}`, \
run inside its root file system.
if [ -e /{MARKER} ]; then exec {real} "$@"; fi
export SLURM_CONF={shlex.quote(str(layout.slurm_conf))}
exec {shlex.quote(str(layout.bin / ".enter"))} {real} "$@"
"""


def daemon_path(layout: Layout, daemon: str) -> str:
    """Where the daemon is started from inside the root file system: a symlink named like its process."""
    return f"/usr/local/sbin/{layout.lane.comm(daemon)}"


def write(layout: Layout) -> None:
    """The enter script, the client wrappers, the marker and the daemon symlinks (idempotent)."""
    root = layout.lane.rootfs
    assert root is not None
    layout.bin.mkdir(parents=True, exist_ok=True)
    files = {layout.bin / ".enter": enter_script(layout)}
    files.update({layout.bin / p: wrapper_script(layout, p) for p in CLIENTS})
    write_executables(files)
    (root / MARKER).write_text(f"{layout.lane.slurm}\n")
    for daemon, target in DAEMONS.items():
        link = root / daemon_path(layout, daemon).lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(target)


def argv(layout: Layout, args: list[str]) -> list[str]:
    """ARGS run inside the lane's root file system (unchanged for the machine's own Slurm, and for the node lane,
    whose clients are the machine's own)."""
    chrooted = layout.lane.rootfs is not None and not layout.lane.rootfs_nodes_only
    return [str(layout.bin / ".enter"), *args] if chrooted else args


# The node lane (Lane.rootfs_nodes_only): its nodes see none of the BASE_BINDS, only what a compute node shares
# with a login node on ParallelCluster (the shared file system) and the lane's own Slurm and munge state.
NODE_SYSTEM_BINDS = ("/dev", "/sys")


def node_binds(layout: Layout) -> list[str]:
    """Host dirs every node of the node lane sees at the same path: its Slurm config, munge's socket, pid files,
    logs and the shared dir (also seen at SHARED_MOUNT). Each node's own spool dir is bound apart."""
    assert layout.lane.shared_dir is not None
    return [str(p) for p in (layout.etc, layout.munge, layout.run, layout.log, layout.lane.shared_dir)]


def node_enter_script(layout: Layout) -> str:
    """Run a command on node $HPC_LANE_HOSTNAME: its own UTS and mount namespaces, chroot into the lane's root file
    system, a private /tmp and /dev/shm. Of this machine it sees /dev, /sys, node_binds() and its spool dir: not the
    checkout, the venv, this machine's Python, /root, /home or /tmp."""
    root = shlex.quote(str(layout.lane.rootfs))
    system = " ".join(shlex.quote(d) for d in NODE_SYSTEM_BINDS)
    dirs = " ".join(shlex.quote(d) for d in node_binds(layout))
    spool = shlex.quote(str(layout.spool))
    return f"""#!/bin/sh
# Written by `python -m testbench up --slurm {layout.lane.suite}`: run a command on node $HPC_LANE_HOSTNAME, inside \
{layout.lane.suite}'s root file system.
set -e
[ -n "$HPC_LANE_HOSTNAME" ] || {{ echo "HPC_LANE_HOSTNAME (the node's name) is not set" >&2; exit 2; }}
exec unshare --mount --propagation private --uts -- /bin/sh -c '
  set -e
  root="$1"; shift
  mount -t proc proc "$root/proc"
  for d in {system}; do mount --rbind "$d" "$root$d"; done
  mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
  mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
  for d in {dirs} {spool}/slurmd-"$HPC_LANE_HOSTNAME"; do
    mkdir -p "$d" "$root$d"
    mount --bind "$d" "$root$d"
  done
{_shared_mount_lines(layout)}  hostname "$HPC_LANE_HOSTNAME"
  exec chroot "$root" /bin/sh -c "cd /; exec \\"\\$@\\"" sh "$@"
' sh {root} "$@"
"""


# The node lane's submit side runs this machine's clients, except these: this machine's srun 22.05 cannot read
# the I/O set-up message of the nodes' slurmstepd 20.11 ("io_init_msg_unpack: unpack error", seen Nov 2026), while
# bullseye's srun 20.11 works with the 22.05 controller. Its srun is the nodes' own, as on a real cluster.
NODE_LANE_CLIENTS = ("srun",)


def write_node_entry(layout: Layout) -> None:
    """The node lane's scripts (the nodes' enter script; the submit side's enter script and NODE_LANE_CLIENTS'
    wrappers), the marker and the slurmd symlink named like its process (idempotent)."""
    root = layout.lane.rootfs
    assert root is not None
    layout.sbin.mkdir(parents=True, exist_ok=True)
    layout.bin.mkdir(parents=True, exist_ok=True)
    files = {layout.node_enter: node_enter_script(layout), layout.bin / ".enter": enter_script(layout)}
    files.update({layout.bin / p: wrapper_script(layout, p) for p in NODE_LANE_CLIENTS})
    write_executables(files)
    remove_stale_mount_points(root)
    (root / MARKER).write_text(f"{layout.lane.suite}\n")
    link = root / daemon_path(layout, "slurmd").lstrip("/")
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(DAEMONS["slurmd"])


def write_executables(files: dict[Path, str]) -> None:
    """Write each script where its text changed (a running lane's wrappers stay as they are), executable."""
    for path, text in files.items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        path.chmod(0o755)
