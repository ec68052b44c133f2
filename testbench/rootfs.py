"""A Debian root file system for a newer Slurm than this machine's own (trixie's 24.11, forky's 26.05 on bookworm).

Trixie's and forky's Slurm need glibc >= 2.38, which bookworm lacks, so it runs under `chroot` into a tree that
`debootstrap` builds from the same Debian mirror apt on this machine already uses. Built once under /var/tmp
and reused: a `.hpc-packages` stamp names what was installed, so a changed package list installs the rest.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterable

from toolkit.errors import HpcError
from testbench import install
from testbench.layout import Node

APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
STAMP = ".hpc-packages"
DEBOOTSTRAP_SCRIPTS = Path("/usr/share/debootstrap/scripts")
BUILD_TIMEOUT = 1200


def _source_files(sources: tuple[Path, ...]) -> list[Path]:
    files = []
    for path in sources:
        if path.is_dir():
            files += sorted(p for p in path.iterdir() if p.suffix in (".list", ".sources"))
        elif path.is_file():
            files.append(path)
    return files


def debian_mirror(sources: tuple[Path, ...] = APT_SOURCES) -> str:
    """The Debian archive URL apt here uses (its main suite, not -security), from one-line or deb822 files."""
    candidates: list[str] = []
    for path in _source_files(sources):
        text = path.read_text(errors="replace")
        # one-line format: deb [options] URL SUITE COMPONENTS
        for m in re.finditer(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", text, re.M):
            if not m.group(2).endswith("-security"):
                candidates.append(m.group(1))
        # deb822: stanzas separated by blank lines
        for stanza in re.split(r"\n\s*\n", text):
            fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.M))
            suites = fields.get("Suites", "").split()
            if "deb" in fields.get("Types", "").split() and suites and \
                    not all(s.endswith("-security") for s in suites):
                candidates += fields.get("URIs", "").split()
    debian = [url for url in candidates if re.search(r"/debian/?$", url)]
    if not debian:
        raise HpcError("no Debian archive found in apt's sources (/etc/apt/sources.list*)",
                       fix="the newer Slurm lanes build a Debian root file system: run it on a Debian machine "
                           "whose apt sources name a Debian mirror")
    return debian[0].rstrip("/")


def debootstrap_command(suite: str, root: Path, mirror: str, scripts: Path = DEBOOTSTRAP_SCRIPTS) -> list[str]:
    """debootstrap's command line for SUITE. A suite newer than this machine's debootstrap (bookworm's 1.0.128
    has no `forky` script: "E: No such script") is built with its `sid` script, which every suite since
    bullseye links to (debootstrap's scripts/trixie -> sid); bookworm's keyring already has the trixie-era key
    that signs forky's Release (checked with gpgv, Nov 2026)."""
    command = ["debootstrap", "--variant=minbase", suite, str(root), mirror]
    if not (scripts / suite).exists():
        command.append(str(scripts / "sid"))
    return command


def _check(res: subprocess.CompletedProcess, what: str, log: Path, hint: str = "") -> None:
    log.write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-5:])
        raise HpcError(f"{what} failed:\n{tail}", fix=f"see {log}; check that Debian's archive is reachable{hint}")


def chroot_apt(root: Path, packages: list[str], log: Path) -> None:
    """apt-get install inside ROOT (with /proc mounted in a private mount namespace, services not started)."""
    # Testing's and unstable's Release files are valid for a week only (Valid-Until): a mirror that lags behind
    # (this machine's served forky's of 30 Oct on 24 Nov 2026) is refused as expired. The signature is still
    # checked; only the freshness check is off, for a throwaway test root file system.
    inner = ('apt-get -o Acquire::Check-Valid-Until=false update -q && '
             'apt-get install -y -q --no-install-recommends "$@"')
    script = ('root="$0" cmd="$1"; shift; '
              'mount -t proc proc "$root/proc" && exec chroot "$root" /bin/sh -c "$cmd" sh "$@"')
    policy = root / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")  # the packages must not start their daemons: we start ours
    policy.chmod(0o755)
    res = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script,
                          str(root), inner, *packages], capture_output=True, text=True, timeout=BUILD_TIMEOUT,
                         env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    _check(res, f"apt-get install {' '.join(packages)} in {root}", log)


def write_hosts(root: Path, nodes: Iterable[Node]) -> None:
    """The root file system's own /etc/hosts: its node names resolve to its lane's addresses, not the host's."""
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback", *install.hosts_lines(nodes)]
    text = "\n".join(lines) + "\n"
    hosts = root / "etc/hosts"
    if not hosts.exists() or hosts.read_text() != text:
        hosts.write_text(text)


def installed_packages(root: Path) -> set[str]:
    stamp = root / STAMP
    return set(stamp.read_text().split()) if stamp.is_file() else set()


def ensure(root: Path, suite: str, packages: tuple[str, ...], log_dir: Path) -> dict:
    """Build ROOT with debootstrap if absent, install what PACKAGES it lacks; returns what it did and how long.
    One build at a time: a second caller (e.g. another test session) waits for the first and reuses it."""
    import fcntl

    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.with_name(root.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure(root, suite, packages, log_dir)


def _ensure(root: Path, suite: str, packages: tuple[str, ...], log_dir: Path) -> dict:
    t0 = time.monotonic()
    did: dict = {"rootfs": str(root), "built": False, "installed": []}
    if not (root / "etc/debian_version").is_file() or not (root / STAMP).exists():
        if os.geteuid() != 0:
            raise HpcError(f"the root file system {root} is not built yet and building it needs root",
                           fix="run as root once (it is cached afterwards)")
        install.install_packages(("debootstrap",))
        tmp = root.with_name(root.name + ".building")
        shutil.rmtree(tmp, ignore_errors=True)  # a build cut short is started over
        log_dir.mkdir(parents=True, exist_ok=True)
        res = subprocess.run(debootstrap_command(suite, tmp, debian_mirror()),
                             capture_output=True, text=True, timeout=BUILD_TIMEOUT)
        _check(res, f"debootstrap {suite}", log_dir / "debootstrap.log",
               hint="; a release key it does not know needs a newer keyring (apt-get install debian-archive-keyring)")
        (tmp / STAMP).write_text("")
        shutil.rmtree(root, ignore_errors=True)
        tmp.rename(root)
        did["built"] = True
    missing = sorted(set(packages) - installed_packages(root))
    if missing:
        log_dir.mkdir(parents=True, exist_ok=True)
        chroot_apt(root, missing, log_dir / "apt.log")
        (root / STAMP).write_text("\n".join(sorted(installed_packages(root) | set(missing))) + "\n")
        did["installed"] = missing
    did["seconds"] = round(time.monotonic() - t0, 1)
    return did
