"""A researcher's own module (launcher kind python-module, outside toolkit.workloads): `python -m MODULE ARGV...`
after toolkit.job.user_main, per rank or under torchrun (toolkit.launchers.torchrun); its arguments are its own."""

from __future__ import annotations

from typing import Literal

from toolkit.job.rank import Arg
from toolkit.job.scaling import Derived
from toolkit.launchers import torchrun
from toolkit.launchers.base import PYTORCH_JOB, Launcher


class Module(Launcher):
    kind = "python-module"
    kubernetes = PYTORCH_JOB

    def what(self, section) -> str:
        return f"the module {section.module}"

    def program(self, section, root: str, nodes: int, tasks: int, device: str,
                threads: int | None) -> tuple[list[Arg], list[Derived]]:
        program, how = torchrun.styled(section, torchrun.user_main(section, ["-m", section.module]), nodes, tasks)
        return program, [how]

    def user_code(self, section) -> tuple[Literal["script", "module"], str] | None:
        return "module", section.module or ""


LAUNCHER = Module()
