"""Machine set-up the cluster needs: Debian packages (without letting them start services) and /etc/hosts."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Iterable, Iterator

from toolkit.errors import HpcError
from testbench.layout import Node

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "slurmdbd", "slurm-wlm-mysql-plugin", "mariadb-server")
POLICY_RC = Path("/usr/sbin/policy-rc.d")
APT_LISTS = Path("/var/lib/apt/lists")
HOSTS = Path("/etc/hosts")
HOSTS_MARK = "# hpc-sandbox"


def missing_packages(packages: Iterable[str] = PACKAGES) -> list[str]:
    res = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${db:Status-Abbrev}\n", *packages],
                         capture_output=True, text=True, timeout=30)
    installed = {line.split()[0] for line in res.stdout.splitlines() if line.split()[1:2] == ["ii"]}
    return [p for p in packages if p not in installed]


@contextlib.contextmanager
def services_not_started() -> Iterator[None]:
    """Debian package scripts start their daemons unless policy-rc.d says no (exit 101): we start our own.

    An existing policy-rc.d is the machine owner's and is left as it is; ours is removed afterwards.
    """
    if POLICY_RC.exists():
        yield
        return
    POLICY_RC.write_text("#!/bin/sh\n# temporary, written by the test bench while it installs packages\nexit 101\n")
    POLICY_RC.chmod(0o755)
    try:
        yield
    finally:
        POLICY_RC.unlink(missing_ok=True)


def _apt(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return subprocess.run(["apt-get", *args], capture_output=True, text=True, env=env, timeout=900)


def install_packages(packages: Iterable[str] = PACKAGES) -> list[str]:
    """Install what is missing; returns what was installed. `apt-get update` first when no lists exist."""
    missing = missing_packages(packages)
    if not missing:
        return []
    if os.geteuid() != 0:
        raise HpcError(f"packages missing: {' '.join(missing)}", fix="run as root (it installs them with apt-get)")
    install = ("install", "-y", "-q", "--no-install-recommends", *missing)
    with services_not_started():
        if not any(APT_LISTS.glob("*Packages*")):
            _apt("update", "-q")
        res = _apt(*install)
        if res.returncode != 0:  # stale lists: refresh once and retry
            _apt("update", "-q")
            res = _apt(*install)
    if res.returncode != 0:
        tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-5:])
        raise HpcError(f"apt-get install {' '.join(missing)} failed:\n{tail}",
                       fix="check that Debian's package archive is reachable and `apt-get update` works")
    return missing


def hosts_lines(nodes: Iterable[Node]) -> list[str]:
    return [f"{n.addr} {n.name} {HOSTS_MARK}" for n in nodes]


def add_hosts(nodes: Iterable[Node], hosts: Path = HOSTS) -> list[str]:
    """Append `ADDR NAME` lines for NODES that /etc/hosts does not map yet; returns the lines added.

    Appended in place, not replaced: in containers /etc/hosts is often a bind mount.
    """
    nodes = list(nodes)
    text = hosts.read_text() if hosts.exists() else ""
    present = {tuple(line.split()[:2]) for line in text.splitlines() if not line.lstrip().startswith("#")}
    new = [line for n, line in zip(nodes, hosts_lines(nodes), strict=True) if (n.addr, n.name) not in present]
    if new:
        with hosts.open("a") as f:
            f.write(("" if text.endswith("\n") or not text else "\n") + "\n".join(new) + "\n")
    return new
