"""Run Slurm's client commands with a timeout; find them on PATH or in ParallelCluster's /opt/slurm/bin."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from toolkit.errors import HpcError

PCLUSTER_SLURM_BIN = Path("/opt/slurm/bin")
DEFAULT_TIMEOUT = 20.0


def find(program: str) -> str | None:
    """Path of a Slurm client program (PATH first, then ParallelCluster's install dir), or None."""
    found = shutil.which(program)
    if found:
        return found
    candidate = PCLUSTER_SLURM_BIN / program
    return str(candidate) if os.access(candidate, os.X_OK) else None


def slurm_installed() -> bool:
    return find("sbatch") is not None


def run(args: list[str], timeout: float = DEFAULT_TIMEOUT, check: bool = True,
        input: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a Slurm command; a missing program, a timeout or (with check) a failure is an HpcError."""
    program = find(args[0])
    if program is None:
        raise HpcError(f"Slurm's `{args[0]}` is not installed here",
                       fix="run on a Slurm login/head node (or put Slurm's client commands on PATH), "
                           "or use --executor local")
    try:
        res = subprocess.run([program, *args[1:]], capture_output=True, text=True, timeout=timeout, input=input,
                             env=env)
    except subprocess.TimeoutExpired:
        raise HpcError(f"`{' '.join(args[:2])}` did not answer within {timeout:.0f} s: slurmctld may be down",
                       fix="check that slurmctld runs (`scontrol ping`) and SLURM_CONF names your cluster's "
                           "slurm.conf") from None
    if check and res.returncode != 0:
        detail = (res.stderr or res.stdout).strip().splitlines()
        raise HpcError(f"`{args[0]}` failed: {detail[-1] if detail else f'exit {res.returncode}'}",
                       fix=_fix_for(res.stderr))
    return res


def _fix_for(stderr: str) -> str:
    text = stderr.lower()
    if "unable to contact slurm controller" in text or "connection refused" in text or "zero bytes" in text:
        return ("Slurm's controller does not answer: is SLURM_CONF set to your cluster's slurm.conf? "
                "(`scontrol ping`)")
    if "invalid partition" in text:
        return "pick a partition that exists (`sinfo -s` lists them) with --queue"
    if "node count specification invalid" in text or "requested node configuration is not available" in text:
        return "ask for fewer nodes or resources than the partition has (`sinfo -p QUEUE`)"
    return "see Slurm's message above"


def controller_down(consequence: str) -> HpcError:
    return HpcError(f"the Slurm controller (slurmctld) is not answering: {consequence}",
                    fix="is SLURM_CONF set to your cluster's slurm.conf, and does slurmctld run? (`scontrol ping`)")


def unreachable(res: subprocess.CompletedProcess) -> bool:
    """Whether a Slurm command failed because slurmctld did not answer."""
    return res.returncode != 0 and "unable to contact slurm controller" in (res.stderr + res.stdout).lower()


def check_controller(consequence: str = "nothing was submitted") -> None:
    """Fail (before anything is submitted) when slurmctld does not answer."""
    res = run(["scontrol", "ping"], timeout=10, check=False)
    if res.returncode != 0 or "DOWN" in res.stdout:
        raise controller_down(consequence)


def hostnames(nodelist: str) -> list[str]:
    """Expand a Slurm node list (`n[1-3]`) with `scontrol show hostnames`."""
    return run(["scontrol", "show", "hostnames", nodelist]).stdout.split()
