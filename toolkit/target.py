"""What a target does with a planned job: the small interface the plan, sweeps, `hpc jobs` and the summary are
written over (torchx's scheduler split: dry run, then schedule; submitit's tiny Executor).

    dry_run(spec, run_dir)   the target's part of the plan, nothing written or sent: the command that submits
                             (sbatch), the executor's parameters and the batch script it will send (submitit), or
                             the manifests (Kubernetes)
    check(plan)              whether the target would take the job, before anything is written
    schedule(plan)           submit it; the job id
    status(job_ids, run)     each job's state, as the target knows it
    cancel(job_ids)          end them
    logs(run, job_id, rank)  where one rank's output is

The implementations live in their rooms: submitit-on-Slurm, sbatch and local in toolkit/slurm/targets.py (all
three run the job the Slurm materializer made), Kubernetes in toolkit/k8s/target.py. The kinds are
toolkit.rundir.Executor's, the one vocabulary of `--executor`, the plan, the run dir's metadata and `hpc jobs`.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from toolkit.errors import HpcError
    from toolkit.rundir import RunDir
    from toolkit.slurm.status import JobStatus


@dataclasses.dataclass(frozen=True)
class Dispatch:
    """A target's part of a plan (dry_run): what the plan shows and schedule() uses, exactly."""

    python: str | None = None  # submitit: the Python that runs its per-rank code on the nodes
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)  # submitit: the executor's parameters
    batch_script: str | None = None  # submitit on Slurm: the batch script it hands to sbatch
    argv: tuple[str, ...] | None = None  # sbatch: the command that submits


class Target(Protocol):
    kind: str  # toolkit.rundir.Executor's value
    summary: str  # how a job goes, in a few words (`hpc recipes submit`'s summary)
    scheduler: str  # who runs its jobs: "slurm" (one query answers for every such job), "local", "kubernetes"

    def sweep_refusal(self, recipe: str) -> HpcError | None:
        """Why a sweep (a job array) of `recipe` cannot go this way; None where it can."""
    def dry_run(self, spec: Any, run_dir: Path, *, array: bool = False) -> Dispatch: ...

    def describe(self, dispatch: Dispatch) -> str: ...

    def check(self, plan: Any) -> None: ...

    def schedule(self, plan: Any) -> str: ...

    def status(self, job_ids: list[str], run: RunDir | None) -> dict[str, JobStatus]: ...

    def cancel(self, job_ids: list[str]) -> None: ...

    def logs(self, run: RunDir, job_id: str, rank: int, stream: str = "out") -> Path | None: ...


# kind -> "module:class", imported on first use (submitit, jinja2 and the Kubernetes schemas stay out of `hpc --help`)
TARGETS = {"slurm": "toolkit.slurm.targets:SubmititSlurm", "sbatch": "toolkit.slurm.targets:Sbatch",
           "local": "toolkit.slurm.targets:Local", "kubernetes": "toolkit.k8s.target:Kubernetes"}


def target_for(kind: str) -> Target:
    """The target of a kind (an Executor, or "kubernetes")."""
    module, _, name = TARGETS[str(kind)].partition(":")
    target: Target = getattr(importlib.import_module(module), name)()
    return target
