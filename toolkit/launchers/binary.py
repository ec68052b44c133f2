"""A binary (launcher kind binary, e.g. nccl-tests): the program itself per rank under srun (`srun --mpi` with
launcher.mpi), no Python. On Kubernetes an MPI binary is an MPIJob; one without `mpi` has no form there."""

from __future__ import annotations

from toolkit.job.rank import Arg
from toolkit.job.scaling import Derived
from toolkit.launchers.base import MPI_JOB, Launcher, no_kubernetes_form, under


class Binary(Launcher):
    kind = "binary"
    python = False
    kubernetes = MPI_JOB

    def what(self, section) -> str:
        return f"the binary {section.program}"

    def program(self, section, root: str, nodes: int, tasks: int, device: str,
                threads: int | None) -> tuple[list[Arg], list[Derived]]:
        return [under(root, section.program or "")], []

    def kubernetes_kind(self, recipe) -> str:
        if not recipe.launcher.mpi:
            raise no_kubernetes_form(recipe, " without `mpi`")
        return MPI_JOB


LAUNCHER = Binary()
