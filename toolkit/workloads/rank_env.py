"""Where this process sits in the job: the rank contract (toolkit.job.rank) read back from the environment.

Every rank hpc starts has RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (the rank program exports
them under srun, torchrun sets them for its workers). Kept free of torch.
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


def _as_int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "")
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


def rank_env(environ: Mapping[str, str] | None = None) -> RankEnv:
    """Read the rank layout; a lone process (nothing set) is rank 0 of 1 on 127.0.0.1.

    Raises ValueError when the variables contradict each other or a multi-rank job lacks MASTER_ADDR.
    """
    env = os.environ if environ is None else environ
    rank = _as_int(env, "RANK", 0)
    local_rank = _as_int(env, "LOCAL_RANK", 0)
    world_size = _as_int(env, "WORLD_SIZE", 1)
    if world_size < 1 or not 0 <= rank < world_size or local_rank < 0:
        raise ValueError(f"inconsistent rank layout: rank={rank} local_rank={local_rank} world_size={world_size}")
    master_addr = env.get("MASTER_ADDR") or None
    if master_addr is None:
        if world_size > 1:
            raise ValueError("MASTER_ADDR is not set for a job of more than one rank")
        master_addr = "127.0.0.1"
    master_port = _as_int(env, "MASTER_PORT", DEFAULT_MASTER_PORT)
    return RankEnv(rank, local_rank, world_size, master_addr, master_port)
