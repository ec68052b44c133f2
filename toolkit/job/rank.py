"""What every rank runs, written once: the rank contract and the rank program.

The rank program is `bash -c RANK_SCRIPT WORDS...`. srun starts it once per Slurm task on both submission paths:
the rendered script's srun line runs it, and submitit's per-rank process (toolkit.slurm.rank_task) runs the very
same argv as its child. It

  - exports the rank contract: torch's env:// variables RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and
    GROUP_RANK (the node's index), taken from the Slurm task (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, which
    srun sets per task). MASTER_ADDR and MASTER_PORT come from the job's set-up block (templates/setup.sh.j2),
    the port from master_port(job id). Under the torchrun style the Slurm task is a node's agent and torchrun
    sets the contract for its workers (torch.distributed.run), so nothing is exported there;
  - then execs the workload: the literal WORDS (never re-read by a shell) followed by the per-rank words, which
    the task's own bash expands from the contract ("${RANK}", "${MASTER_ADDR}", ...).

Kept free of heavy imports: submitit unpickles the per-rank callable on every rank, and whatever this module
imports is paid once per rank at job start.
"""

from __future__ import annotations

import dataclasses
import enum
import shlex
from typing import Mapping, Union

from toolkit.errors import HpcError
# The rendezvous port: node-side code (the spares supervisor) computes it too.
from toolkit.node.rank import MASTER_PORT_BASE, MASTER_PORT_SPAN, RESTART_PORT_STRIDE, master_port  # noqa: F401

# The rank contract from the Slurm task's variables (srun sets these per task; sbatch(1), srun(1) "OUTPUT
# ENVIRONMENT VARIABLES"); WORLD_SIZE and LOCAL_WORLD_SIZE are the job's shape, known when it is planned.
CONTRACT_FROM_SLURM = (("RANK", "SLURM_PROCID"), ("LOCAL_RANK", "SLURM_LOCALID"), ("GROUP_RANK", "SLURM_NODEID"))


class RankVar(enum.Enum):
    """A per-rank value in a command, named by the contract variable that carries it inside each task."""

    RANK = "RANK"
    LOCAL_RANK = "LOCAL_RANK"
    MASTER_ADDR = "MASTER_ADDR"
    MASTER_PORT = "MASTER_PORT"
    # The node's index, for a per-node agent that needs it given (accelerate's --machine_rank): not in the rank
    # contract (a rank reads GROUP_RANK); the launcher's rank prelude sets it (toolkit.launchers.accelerate)
    NODE_RANK = "NODE_RANK"


Arg = Union[str, RankVar, tuple[Union[str, RankVar], ...]]

# Rank 0's view with the rendezvous left symbolic: what `show` and `submit --dry-run` print.
RANK0_PREVIEW = {"RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "$MASTER_ADDR", "MASTER_PORT": "$MASTER_PORT",
                 "NODE_RANK": "0"}


@dataclasses.dataclass(frozen=True)
class RankProgram:
    """`bash -c script words...`: what srun starts on every Slurm task of a job."""

    script: str  # the bash program: contract exports, then exec "$0" "$@" with the per-rank words appended
    words: tuple[str, ...]  # the command's literal head: $0 and $@ of the script

    @property
    def argv(self) -> tuple[str, ...]:
        return ("bash", "-c", self.script, *self.words)


def rank_program(command: tuple[Arg, ...], world_size: int, local_world_size: int, contract: bool,
                 prelude: str = "") -> RankProgram:
    """The rank program of a command. `contract`: export the rank contract (False under torchrun, which sets it).
    `prelude`: shell run first (a container's software activation, toolkit.job.container; the launcher's resume
    rule, toolkit.launchers)."""
    head, tail = split_command(command)
    exports = []
    if contract:
        exports = [f'{name}="${{{slurm}}}"' for name, slurm in CONTRACT_FROM_SLURM]
        exports += [f"WORLD_SIZE={world_size}", f"LOCAL_WORLD_SIZE={local_world_size}"]
    script = " ".join(['exec "$0" "$@"', *(shell_word(arg) for arg in tail)])
    if exports:
        script = f"export {' '.join(exports)}; {script}"
    if prelude:
        script = f"{prelude}; {script}"
    return RankProgram(script, head)


def shell_word(arg: Arg) -> str:
    """One argument as a bash word: literals single-quoted, RankVars as "${NAME}", tuples concatenated."""
    parts = arg if isinstance(arg, tuple) else (arg,)
    return "".join(shlex.quote(p) if isinstance(p, str) else f'"${{{p.value}}}"' for p in parts)


def split_command(command: tuple[Arg, ...]) -> tuple[tuple[str, ...], tuple[Arg, ...]]:
    """(literal head, per-rank tail): the head is passed as words, the tail is expanded by each task's bash.

    The tail starts at the first per-rank value, or at the flag just before it (so `--flag "$VAR"` stays whole).
    """
    head = 0
    while head < len(command) and isinstance(command[head], str):
        head += 1
    if 0 < head < len(command) and str(command[head - 1]).startswith("-"):
        head -= 1
    return command[:head], command[head:]  # type: ignore[return-value]


def preview_argv(command: tuple[Arg, ...], values: Mapping[str, str] = RANK0_PREVIEW) -> list[str]:
    """A rank's argv with RankVars filled from `values` (by contract name): for people and tests, not for ranks
    (the rank program's bash expands them at run time)."""
    def value(part: str | RankVar) -> str:
        if isinstance(part, str):
            return part
        if part.value not in values:
            raise HpcError(f"no value for {part.value}", fix="pass every contract variable the command uses")
        return values[part.value]

    return ["".join(value(p) for p in (arg if isinstance(arg, tuple) else (arg,))) for arg in command]
