"""A researcher's script or module under Hugging Face Accelerate (launcher kind accelerate): `accelerate launch` on
every node, which starts torch.distributed.run with the node's ranks (its --multi_gpu path), so one Slurm task per
node, as hpc's torchrun style.

Its options, as accelerate 1.15's own parser reads them (huggingface/accelerate src/accelerate/commands/launch.py,
launch_command_parser(); the multi-node values go to torchrun in src/accelerate/utils/launch.py,
prepare_multi_gpu_env()): --num_machines, --num_processes (all ranks, not per node), --machine_rank (the node's
index), --main_process_ip and --main_process_port (the rendezvous endpoint: the first node's MASTER_ADDR and
MASTER_PORT, which the job's set-up exports), --rdzv_backend c10d (as hpc's torchrun: restarts re-rendezvous;
accelerate's default, static, cannot restart), --rdzv_conf join_timeout, --max_restarts; the rendezvous id is
torchrun's own PET_RDZV_ID from the job's set-up, which torchrun's parser reads when accelerate hands it the
settings. --multi_gpu is accelerate's torch.distributed.run launcher on every device: with --cpu it would start a
single process; on CPU, ACCELERATE_USE_CPU makes the ranks' Accelerator use the CPU and gloo (as `--cpu` does).
--no_python lets each rank start with hpc's user_main (the rank contract's checks, the rendezvous timeout), as
under torchrun. Accelerate's own choices (mixed precision, ...) are the script's: Accelerator(mixed_precision=...).

On Kubernetes: a PyTorchJob whose pods run accelerate launch themselves, with the endpoint from the Training
Operator's PET_RDZV_ENDPOINT (node 0's pod). With c10d, torchrun takes the node's rank from the rendezvous; accelerate
reads --machine_rank only to test the port on the first machine, which each pod, in its own network namespace,
passes.
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

from toolkit.job.rank import MASTER_PORT_BASE, RANK0_PREVIEW, Arg, RankVar, preview_argv
from toolkit.job.scaling import Derived
from toolkit.launchers import torchrun
from toolkit.launchers.base import PYTORCH_JOB, Launcher, checked_script

PROGRAM = "accelerate launch"
MODULE = "accelerate.commands.launch"
CPU_ENV = (("ACCELERATE_USE_CPU", "true"),)  # src/accelerate/state.py: the ranks' Accelerator on the CPU (gloo)
# SIGUSR2 ignored (toolkit.launchers.torchrun.TORCHRUN says why), torchrun's store per round, then accelerate's main()
CODE = ("import os, signal, sys; os.environ.update({env!r}); signal.signal(signal.SIGUSR2, signal.SIG_IGN); "
        f"from {MODULE} import main; sys.exit(main())")


def code(device: str) -> str:
    """The `python -c` program that runs accelerate launch on a node of `device`."""
    return CODE.format(env=dict(torchrun.TORCHRUN_ENV + (CPU_ENV if device == "cpu" else ())))


class Accelerate(Launcher):
    kind = "accelerate"
    kubernetes = PYTORCH_JOB
    one_task_per_node = True
    parser = "accelerate launch's"
    devices = ("gpu", "cpu")  # what accelerate's multi-GPU / CPU launch forms start

    def what(self, section) -> str:
        return f"the script {section.script}" if section.script else f"the module {section.module}"

    def program(self, section, root: str, nodes: int, tasks: int, device: str,
                threads: int | None) -> tuple[list[Arg], list[Derived]]:
        self.refuse_device(device, fix="run accelerate recipes on a GPU or CPU queue (other accelerators have "
                                       "their vendors' own launchers)")
        world = nodes * tasks
        target = ["-m", section.module] if section.module else [checked_script(root, section.script)]
        launch: list[Arg] = [
            "python", "-c", code(device), "--num_machines", str(nodes), "--num_processes", str(world),
            "--machine_rank", RankVar.NODE_RANK, "--main_process_ip", RankVar.MASTER_ADDR,
            "--main_process_port", RankVar.MASTER_PORT, "--rdzv_backend", "c10d",
            "--rdzv_conf", f"join_timeout={section.rendezvous_timeout_s}", "--max_restarts", str(section.max_restarts),
            *(["--multi_gpu"] if world > 1 else []),  # accelerate refuses it for one process (a plain run there)
            "--no_python", *torchrun.user_main(section, target)]
        return launch, [Derived("launcher", f"accelerate launch per node, {tasks} ranks each, max "
                                            f"{section.max_restarts} restarts",
                                "launcher kind accelerate: torch.distributed.run with a c10d rendezvous on the "
                                "first node" + (", ACCELERATE_USE_CPU on CPU" if device == "cpu" else ""))]

    def rank_prelude(self) -> str:
        return 'NODE_RANK="$SLURM_NODEID"'  # srun's node index of the task (one task per node)

    def pod_prelude(self) -> str:
        # the Training Operator's c10d endpoint (elasticPolicy: node 0's pod); c10d ranks the nodes itself
        return 'NODE_RANK=0 MASTER_ADDR="${PET_RDZV_ENDPOINT%:*}" MASTER_PORT="${PET_RDZV_ENDPOINT##*:}"'

    def check_arguments(self, recipe, spec, argv: list[str]) -> list[str]:
        from toolkit.job.argcheck import Program, check_argparse

        script = f"{self.what(recipe.launcher)}'s own arguments were not checked: hpc has no parser for them"
        try:
            make_parser, version = _parser()
        except Exception as exc:
            reason = ("accelerate is not installed" if isinstance(exc, ImportError)
                      else f"accelerate does not load ({exc})")
            return [f"arguments: not checked: {reason} where hpc runs, so neither accelerate launch's options nor "
                    f"{script}"]
        # rank 0's words with a port in place of the symbolic $MASTER_PORT (the parser wants a number)
        argv = preview_argv(spec.command, {**RANK0_PREVIEW, RankVar.MASTER_PORT.value: str(MASTER_PORT_BASE)})
        words = argv[argv.index("-c") + 2:]  # after `python -c CODE`
        parser = make_parser()

        def parse(parser: argparse.ArgumentParser, words: list[str]):
            return parser.parse_known_args(words)

        check_argparse(recipe, Program(PROGRAM, f"{PROGRAM} --help", f"accelerate {version}"), parser, words, parse)
        return [f"arguments: {script}"]


@functools.lru_cache(maxsize=None)
def _parser() -> tuple[Any, str]:
    """accelerate launch's parser factory and accelerate's version; ImportError where accelerate is not installed."""
    from toolkit.job.argcheck import quiet

    with quiet():
        import accelerate
        from accelerate.commands.launch import launch_command_parser
    return launch_command_parser, getattr(accelerate, "__version__", "?")


LAUNCHER = Accelerate()
