"""Running a chroot lane's programs: one `enter` script (private mounts, then chroot) used by the daemons and
by the client wrappers (sbatch, srun, ...) that a user or test puts first on PATH.

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


def enter_script(layout: Layout) -> str:
    root = shlex.quote(str(layout.lane.rootfs))
    dirs = " ".join(shlex.quote(d) for d in binds())
    # HPC_LANE_HOSTNAME: a node's own UTS namespace, so `hostname` inside its jobs says the node's name.
    return f"""#!/bin/sh
# Written by `python -m testbench up --slurm {layout.lane.slurm}`: run a command inside Slurm \
{layout.lane.slurm}'s root file system.
set -e
exec unshare --mount --propagation private ${{HPC_LANE_HOSTNAME:+--uts}} -- /bin/sh -c '
  set -e
  root="$1"; shift
  mount -t proc proc "$root/proc"
  for d in {dirs}; do
    if [ -d "$d" ]; then mkdir -p "$root$d"; else mkdir -p "$(dirname "$root$d")"; touch "$root$d"; fi
    mount --rbind "$d" "$root$d"
  done
  if [ -n "$HPC_LANE_HOSTNAME" ]; then hostname "$HPC_LANE_HOSTNAME"; fi
  exec chroot "$root" /bin/sh -c "cd \\"\\$1\\" 2>/dev/null || cd /; shift; exec \\"\\$@\\"" sh "$PWD" "$@"
' sh {root} "$@"
"""


def wrapper_script(layout: Layout, program: str) -> str:
    real = f"/usr/bin/{program}"
    return f"""#!/bin/sh
# Written by `python -m testbench up --slurm {layout.lane.slurm}`: Slurm {layout.lane.slurm}'s `{program}`, \
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
    for path, text in files.items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        path.chmod(0o755)
    (root / MARKER).write_text(f"{layout.lane.slurm}\n")
    for daemon, target in DAEMONS.items():
        link = root / daemon_path(layout, daemon).lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(target)


def argv(layout: Layout, args: list[str]) -> list[str]:
    """ARGS run inside the lane's root file system (unchanged for the machine's own Slurm)."""
    return args if layout.lane.rootfs is None else [str(layout.bin / ".enter"), *args]
