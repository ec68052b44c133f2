"""Our trainers and benchmarks (launcher kind python-module, a module under toolkit.workloads): `python -m MODULE`
per rank (style script, reading the rank contract) or under torchrun, with our device flags (--device, --backend,
--threads) set from the queue, and their arguments checked by the module's own parser() (and check_values(), where
it has one)."""

from __future__ import annotations

import argparse
import importlib
from typing import Any, Mapping

from toolkit.errors import HpcError
from toolkit.job.rank import Arg
from toolkit.job.scaling import Derived
from toolkit.launchers import torchrun
from toolkit.launchers.base import PYTORCH_JOB, DeviceForm, Launcher

OUR_TRAINERS = "toolkit.workloads."  # modules that take DEVICE_FLAGS (a user's module gets none)
# Our workloads that beat each step (toolkit.node.heartbeat.beat): a hang timeout sees their hangs; any other
# program's only where it calls beat() itself (tests/test_heartbeat.py holds the list to their sources).
BEATING_WORKLOADS = ("toolkit.workloads.resnet", "toolkit.workloads.collectives")
DEVICE_FLAGS = ("--device", "--backend", "--threads")
# the ResNet trainer's --loader values that need CUDA (toolkit.workloads.resnet_loaders)
GPU_LOADERS = ("gpu", "dali")


class Trainer(Launcher):
    kind = "python-module"
    owned_flags = DEVICE_FLAGS
    kubernetes = PYTORCH_JOB
    parser = "its own trainers'"

    def owns_module(self, module: str | None) -> bool:
        return (module or "").startswith(OUR_TRAINERS)

    def what(self, section) -> str:
        return f"the module {section.module}"

    def device_args(self, args: Mapping[str, Any], device: str, threads: int | None,
                    world: int) -> tuple[dict, list[Derived]]:
        from toolkit.accelerators import of_device

        accel = of_device(device)  # the queue's accelerator family: its torch device and collective backend
        form = DeviceForm(args, device)
        loader = args.get("--loader")
        if loader in GPU_LOADERS and accel.torch_device != "cuda":  # said here, not by every rank (resnet_loaders)
            raise HpcError(f"--loader {loader} decodes JPEGs on a CUDA GPU, which this queue does not have "
                           f"({form.why})",
                           fix="use --loader pil there (--set args.--loader=pil, or leave out --profile gpu-data), "
                               "or choose a GPU queue")
        if device == "cpu":
            form.drop(("--amp",), "no mixed precision on CPU")
        form.put("--device", accel.torch_device, accel.torch_device_why)
        form.put("--backend", accel.collective, accel.collective_why)
        if device == "cpu":
            form.put("--threads", threads, "torch threads = CPUs per task (oversubscription costs 2-3x)")
        return form.args, form.derived

    def program(self, section, root: str, nodes: int, tasks: int, device: str,
                threads: int | None) -> tuple[list[Arg], list[Derived]]:
        if section.style == "script":  # one process per rank under srun, reading the rank contract
            return ["python", "-m", section.module], []
        program, how = torchrun.styled(section, torchrun.user_main(section, ["-m", section.module]), nodes, tasks)
        return program, [how]

    def check_arguments(self, recipe, spec, argv: list[str]) -> list[str]:
        from toolkit.job.argcheck import Program, check_argparse

        module = recipe.launcher.module
        try:
            workload = importlib.import_module(module)
        except ImportError as exc:  # the nodes' toolkit may have it; this one does not
            return [f"arguments: not checked: {module} does not import where hpc runs ({exc})"]
        if not hasattr(workload, "parser"):
            return [f"arguments: not checked: {module} exposes no parser() for hpc to check them against"]
        program = Program(f"python -m {module}", f"python -m {module} --help", None)
        post = getattr(workload, "check_values", None)

        def parse(parser: argparse.ArgumentParser, words: list[str]):
            args, extra = parser.parse_known_args(words)
            if post is not None and not extra:
                post(parser, args)
            return args, extra

        check_argparse(recipe, program, workload.parser(), after_module(argv, module), parse)
        return []


def after_module(argv: list[str], module: str) -> list[str]:
    """The words after `-m MODULE` (our trainers run as `python -m MODULE`, directly or under user_main)."""
    for i in range(len(argv) - 1):
        if argv[i] == "-m" and argv[i + 1] == module:
            return argv[i + 2:]
    raise HpcError(f"no `-m {module}` in the job's command", fix="report this as a bug in hpc")


LAUNCHER = Trainer()
