"""The few Slurm client calls node-side code makes (scontrol, sbatch from inside a job), with a timeout each."""

from __future__ import annotations

import re
import subprocess
from typing import Dict, List, Mapping

TIMEOUT_S = 30.0


class SlurmCommandError(RuntimeError):
    """A Slurm command that could not run, did not answer in time, or failed."""


def run(args: List[str], timeout: float = TIMEOUT_S, check: bool = True) -> subprocess.CompletedProcess:
    try:
        res = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmCommandError(f"`{' '.join(args[:2])}` did not answer within {timeout:.0f} s") from None
    except OSError as exc:
        raise SlurmCommandError(f"`{args[0]}` cannot run here: {exc}") from None
    if check and res.returncode != 0:
        lines = (res.stderr or res.stdout).strip().splitlines()
        raise SlurmCommandError(f"`{' '.join(args[:2])}` failed: {lines[-1] if lines else res.returncode}")
    return res


def hostnames(nodelist: str) -> List[str]:
    """Expand a Slurm node list (`n[1-3]`) with `scontrol show hostnames`."""
    return run(["scontrol", "show", "hostnames", nodelist]).stdout.split()


def cpus_per_node(value: str) -> List[int]:
    """The CPUs the job has on each of its nodes, from SLURM_JOB_CPUS_PER_NODE: `72(x2),36` is [72, 72, 36]
    (its format: SchedMD/slurm doc/man/man1/sbatch.1, OUTPUT ENVIRONMENT VARIABLES); [] for anything else."""
    counts: List[int] = []
    for part in value.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            return []
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def submit_env(environ: Mapping[str, str]) -> Dict[str, str]:
    """The environment for an sbatch run from inside a job: without the job's SLURM_* and SBATCH_* variables,
    which sbatch would take as options of the new job (SLURM_CONF stays: it names the cluster)."""
    return {k: v for k, v in environ.items()
            if not k.startswith(("SLURM_", "SBATCH_")) or k == "SLURM_CONF"}
