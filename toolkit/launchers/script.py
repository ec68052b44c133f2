"""A researcher's own script (launcher kind python-script): `python SCRIPT.py ARGV...` after toolkit.job.user_main,
per rank or under torchrun (toolkit.launchers.torchrun). The script must exist where the nodes read it; its
arguments are its own. On Kubernetes a PyTorchJob/TrainJob whose pods read the script from the image or from a
ConfigMap (toolkit.k8s.usercode): the pods do not see the file system it is on here."""

from __future__ import annotations

from typing import Literal

from toolkit.job.rank import Arg
from toolkit.job.scaling import Derived
from toolkit.launchers import torchrun
from toolkit.launchers.base import PYTORCH_JOB, Launcher, checked_script


class Script(Launcher):
    kind = "python-script"
    kubernetes = PYTORCH_JOB

    def what(self, section) -> str:
        return f"the script {section.script}"

    def program(self, section, root: str, nodes: int, tasks: int, device: str,
                threads: int | None) -> tuple[list[Arg], list[Derived]]:
        user = torchrun.user_main(section, [checked_script(root, section.script)])
        program, how = torchrun.styled(section, user, nodes, tasks)
        return program, [how]

    def user_code(self, section) -> tuple[Literal["script", "module"], str] | None:
        return "script", section.script or ""


LAUNCHER = Script()
