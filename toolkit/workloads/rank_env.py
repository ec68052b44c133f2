"""Where this process sits in the job: rank, local rank, world size and rendezvous, from the environment.

torchrun-style variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) win; under plain `srun`
the Slurm task variables stand in for the first three. Kept free of torch so launchers can use it too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class RankEnv:
    rank: int
    local_rank: int
    world_size: int
    master_addr: str
    master_port: int

    @property
    def init_method(self) -> str:
        return f"tcp://{self.master_addr}:{self.master_port}"


def _first(environ: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        if environ.get(name, "") != "":
            return environ[name]
    return None


def _as_int(environ: Mapping[str, str], names: tuple[str, ...], default: int | None) -> int:
    raw = _first(environ, *names)
    if raw is None:
        if default is None:
            raise ValueError(f"none of {', '.join(names)} is set")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{names[0]} must be an integer, got {raw!r}") from None


def rank_env(environ: Mapping[str, str] | None = None) -> RankEnv:
    """Read the rank layout; a lone process (nothing set) is rank 0 of 1 on 127.0.0.1.

    Raises ValueError when the variables contradict each other or a multi-rank job lacks MASTER_ADDR.
    """
    env = os.environ if environ is None else environ
    rank = _as_int(env, ("RANK", "SLURM_PROCID"), 0)
    local_rank = _as_int(env, ("LOCAL_RANK", "SLURM_LOCALID"), 0)
    world_size = _as_int(env, ("WORLD_SIZE", "SLURM_NTASKS"), 1)
    if world_size < 1 or not 0 <= rank < world_size or local_rank < 0:
        raise ValueError(f"inconsistent rank layout: rank={rank} local_rank={local_rank} world_size={world_size}")
    master_addr = _first(env, "MASTER_ADDR")
    if master_addr is None:
        if world_size > 1:
            raise ValueError("MASTER_ADDR is not set for a job of more than one rank")
        master_addr = "127.0.0.1"
    master_port = _as_int(env, ("MASTER_PORT",), DEFAULT_MASTER_PORT)
    return RankEnv(rank, local_rank, world_size, master_addr, master_port)
