"""Our daemons as processes: pid files, liveness, stopping by pid, and spotting Slurm/munge that is not ours.

Everything reads /proc directly (no `ps`, no broad process-name kills): a pid from a pid file counts as ours
only while /proc/PID/comm still names the daemon we started, so a recycled pid is never signalled.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Iterable

from toolkit.errors import HpcError

PROC = Path("/proc")
# The process names a Slurm or munge installation runs; slurmstepd is left out: it is a job step's helper
# that our slurmd forks and that can outlive it for a moment.
GUARDED_DAEMONS = ("munged", "slurmctld", "slurmd", "slurmdbd")


def comm(pid: int, proc: Path = PROC) -> str | None:
    """The process name of PID, or None when there is no such process."""
    try:
        return (proc / str(pid) / "comm").read_text().strip()
    except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
        return None


def read_pid(pid_file: Path) -> int | None:
    try:
        text = pid_file.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def alive(pid: int, name: str, proc: Path = PROC) -> bool:
    """PID is a live (not zombie) process named NAME."""
    if comm(pid, proc) != name:
        return False
    try:
        state = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def running_pid(pid_file: Path, name: str, proc: Path = PROC) -> int | None:
    """The pid in PID_FILE if that process is alive and is NAME."""
    pid = read_pid(pid_file)
    return pid if pid is not None and alive(pid, name, proc) else None


def processes_named(names: Iterable[str], proc: Path = PROC) -> dict[int, str]:
    """pid -> name of every live process whose name is one of NAMES."""
    wanted = set(names)
    found: dict[int, str] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit() and (name := comm(int(entry.name), proc)) in wanted \
                and alive(int(entry.name), name, proc):  # an exited one waiting to be reaped is no daemon
            found[int(entry.name)] = name
    return found


def foreign_daemons(our_pids: Iterable[int], names: Iterable[str] = GUARDED_DAEMONS,
                    proc: Path = PROC) -> dict[int, str]:
    """Slurm or munge daemons (processes named one of NAMES) running here that are not in OUR_PIDS."""
    ours = set(our_pids)
    return {pid: name for pid, name in processes_named(names, proc).items() if pid not in ours}


def stop(pid_file: Path, name: str, timeout: float = 10.0) -> bool:
    """SIGTERM the daemon named in PID_FILE, SIGKILL it after TIMEOUT; True if it was running."""
    pid = running_pid(pid_file, name)
    if pid is None:
        pid_file.unlink(missing_ok=True)
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid, name):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + timeout
        time.sleep(0.05)
    pid_file.unlink(missing_ok=True)
    return True


def wait_for(predicate, timeout: float, what: str, log: Path | None = None, interval: float = 0.05):
    """Poll PREDICATE until it returns something truthy; an HpcError naming WHAT (and its LOG) otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise HpcError(f"{what} not ready after {timeout:.0f} s",
                           fix=f"see {log}" if log else "see the logs in the sandbox state dir")
        time.sleep(interval)
