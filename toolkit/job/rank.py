"""What one rank needs at run time: its per-rank values, its argv, its rendezvous port.

Kept free of heavy imports: submitit unpickles the per-rank callable on every rank, and whatever this
module imports is paid once per rank at job start.
"""

from __future__ import annotations

import enum
from typing import Mapping, Union

from toolkit.errors import HpcError

# MASTER_PORT = BASE + job id % SPAN: concurrent jobs on shared nodes get different ports, and the range stays
# below Linux's ephemeral ports (32768+), which outgoing connections may already hold.
MASTER_PORT_BASE = 15000
MASTER_PORT_SPAN = 16000


class RankVar(enum.Enum):
    """A per-rank value, named by the environment variable that carries it inside each task."""

    RANK = "SLURM_PROCID"
    LOCAL_RANK = "SLURM_LOCALID"
    MASTER_ADDR = "MASTER_ADDR"
    MASTER_PORT = "MASTER_PORT"


Arg = Union[str, RankVar, tuple[Union[str, RankVar], ...]]

# Rank 0's view with the rendezvous left symbolic: what `show` and `submit --dry-run` print.
RANK0_PREVIEW = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "MASTER_ADDR": "$MASTER_ADDR",
                 "MASTER_PORT": "$MASTER_PORT"}


def master_port(job_id: int) -> int:
    """The rendezvous port of a job: every path (sbatch script, submitit) uses this."""
    return MASTER_PORT_BASE + job_id % MASTER_PORT_SPAN


def resolve_argv(command: tuple[Arg, ...], rank_env: Mapping[str, str]) -> list[str]:
    """One rank's argv: RankVars taken from `rank_env` (SLURM_PROCID, SLURM_LOCALID, MASTER_ADDR, MASTER_PORT)."""
    def value(part: str | RankVar) -> str:
        if isinstance(part, str):
            return part
        if part.value not in rank_env:
            raise HpcError(f"the rank's environment has no {part.value}", fix="run the rank under srun (Slurm sets it)")
        return rank_env[part.value]

    return ["".join(value(p) for p in (arg if isinstance(arg, tuple) else (arg,))) for arg in command]
