"""Python code started per rank by srun (style script) or per node by torchrun (style torchrun): the user_main
prelude every researcher's rank runs first, and torchrun as hpc starts it. A helper of the launchers that run
Python (module, script, accelerate), not a kind of its own: `launcher.style` chooses it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.job.rank import Arg
from toolkit.job.scaling import Derived
from toolkit.node.stop import SIGNAL as STOP_SIGNAL

if TYPE_CHECKING:
    from toolkit.recipes.schema import Launcher as LauncherSection

USER_MAIN = Path(__file__).parent.parent / "job" / "user_main.py"  # each Python rank's first code (`python -c`)
# torchrun with SIGUSR2 (toolkit.node.stop.SIGNAL) ignored: Slurm signals every process of the step before the time
# limit, and USR2's default action would kill torchrun (and with it the ranks) while they save. Ranks inherit the
# ignore; a workload that stops on the signal installs its own handler (our trainers), any other resumes from its
# checkpoint after the requeue.
# torchrun's environment on every target (Slurm here, the pods' container env in toolkit.k8s): each rendezvous round
# gets its own store. By default (torch >= 2.4) the workers share the agent's store, which outlives rounds, and tell
# restarts apart by TORCHELASTIC_RESTART_COUNT, which only the agent whose worker failed increments: after a failure
# the nodes' workers disagree and hang (pytorch/pytorch#135712; measured on torch 2.14.1). With the shared store off,
# rank 0's agent picks a free MASTER_PORT each round and every agent reads it from that round's rendezvous store
# (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py, next_rendezvous), so all nodes agree.
TORCHRUN_ENV = (("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"),)
TORCHRUN = (f"import os, signal, sys; os.environ.update({dict(TORCHRUN_ENV)!r}); "
            f"signal.signal(signal.SIG{STOP_SIGNAL}, signal.SIG_IGN); from torch.distributed.run import main; "
            "sys.exit(main())")


def user_main_code() -> str:
    """toolkit.job.user_main's code, without the module's docstring (the contract)."""
    text = USER_MAIN.read_text()
    return text[text.index('"""', 3) + 3:].lstrip()


def user_main(section: LauncherSection, target: list[str]) -> list[Arg]:
    """`python -c USER_MAIN TIMEOUT (SCRIPT | -m MODULE) ARGV...`: a researcher's Python as each rank starts it."""
    return ["python", "-c", user_main_code(), str(section.rendezvous_timeout_s), *target, *section.argv]


def styled(section: LauncherSection, user: list[Arg], nodes: int, tasks: int) -> tuple[list[Arg], Derived]:
    """A rank's Python under the launcher's style: srun per rank, or torchrun per node. torchrun's endpoint (the
    first node, MASTER_ADDR:MASTER_PORT) and id (the job id) come from the job's set-up (PET_RDZV_ENDPOINT,
    PET_RDZV_ID: torchrun's own variables), so the whole argv is literal."""
    if section.style == "script":
        return user, Derived("launcher", "srun: one process per rank", "style script")
    torchrun: list[Arg] = [
        "python", "-c", TORCHRUN, "--nnodes", str(nodes), "--nproc-per-node", str(tasks),
        "--rdzv-backend", "c10d", "--rdzv-conf", f"join_timeout={section.rendezvous_timeout_s}",
        "--max-restarts", str(section.max_restarts), "--no-python"]
    return [*torchrun, *user], Derived(
        "launcher", f"torchrun per node, {tasks} ranks each, max {section.max_restarts} restarts",
        "style torchrun: c10d rendezvous on the first node, the job id as rendezvous id")
