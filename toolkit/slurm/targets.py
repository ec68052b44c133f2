"""The Slurm room's targets (toolkit.target's interface), all three running the job the Slurm materializer made
(toolkit.slurm.materialize) with the same rank program:

    SubmititSlurm  submitit's SlurmExecutor: srun starts one RankTask (toolkit.slurm.rank_task) per Slurm task
    Sbatch         the rendered script itself (toolkit.slurm.render), `sbatch --parsable`: MPI binaries, spares, and
                   nodes whose Python cannot run submitit's side (toolkit.slurm.executors.choose_executor)
    Local          submitit's LocalExecutor: this machine is the one node (where no Slurm is installed)
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

from toolkit.errors import HpcError, UsageError
from toolkit.rundir import RunDir
from toolkit.slurm import executors
from toolkit.slurm.status import JobStatus, State
from toolkit.target import Dispatch


class _OnSlurm:
    """What the two Slurm targets share: the controller's checks, Slurm's job states, scancel."""

    scheduler = "slurm"

    def check(self, plan: Any) -> None:
        """Before anything is written: the controller answers, a containerized job finds pyxis, and `sbatch
        --test-only` takes the job."""
        from toolkit.slurm.commands import check_controller, slurm_installed

        if not slurm_installed():  # a plan for a cluster's Slurm, made off it (executors.planned_without_slurm)
            raise HpcError("submitting needs Slurm, and none is installed here (no sbatch on PATH or in "
                           "/opt/slurm/bin): nothing was submitted",
                           fix="submit from the cluster's head or login node (or put Slurm's client commands on "
                               "PATH); --dry-run shows the plan here")
        check_controller()
        if plan.spec.software.container:  # srun's pyxis options exist only where Slurm loads pyxis (plugstack.conf)
            from toolkit.slurm.pyxis import require_pyxis

            require_pyxis()
        executors.preflight(plan.script)

    def status(self, job_ids: list[str], run: RunDir | None) -> dict[str, JobStatus]:
        from toolkit.slurm import status

        return status.query(job_ids)

    def cancel(self, job_ids: list[str]) -> None:
        from toolkit.slurm import commands

        commands.run(["scancel", *job_ids])

    @staticmethod
    def keep_batch_script(job_id: str, run: Path) -> None:
        """Keep the batch script Slurm stored for the job (what really ran, for reproduction)."""
        from toolkit.slurm import commands

        res = commands.run(["scontrol", "write", "batch_script", job_id, str(run / "batch_script.sh")], check=False)
        if res.returncode != 0:
            (run / "batch_script.sh.missing").write_text(res.stderr or res.stdout)


class SubmititSlurm(_OnSlurm):
    kind = "slurm"
    summary = "submitit, to Slurm"

    def sweep_refusal(self, recipe: str) -> HpcError | None:
        return None  # a sweep is a submitit job array

    def dry_run(self, spec: Any, run_dir: Path, *, array: bool = False) -> Dispatch:
        # an array's batch script is the sweep's (toolkit.submit.sweep), not one task's
        batch = None if array else executors.submitit_batch_script(spec, run_dir / "submitit")
        return Dispatch(python=executors.node_python(spec), parameters=executors.slurm_parameters(spec),
                        batch_script=batch)

    def describe(self, dispatch: Dispatch) -> str:
        return f"submitit's Slurm executor (nodes run {dispatch.python})"

    def schedule(self, plan: Any) -> str:
        job_id = executors.submit_submitit(plan.spec, plan.run_dir, plan.parameters, plan.python, local=False)
        self.keep_batch_script(job_id, plan.run_dir)
        return job_id

    def logs(self, run: RunDir, job_id: str, rank: int, stream: str = "out") -> Path | None:
        return run.rank_log(job_id, rank, stream)


class Sbatch(_OnSlurm):
    kind = "sbatch"
    summary = "sbatch, the rendered script"

    def sweep_refusal(self, recipe: str) -> HpcError | None:
        return HpcError(f"recipe {recipe} goes to sbatch as its rendered script (an MPI binary, --spares, "
                        "--executor sbatch, or nodes whose Python cannot run submitit's side: the plan's note says "
                        "which): a sweep is a submitit job array",
                        fix="submit each variation with `hpc recipes submit --set ...` (or sweep with --executor "
                            "slurm)")

    def dry_run(self, spec: Any, run_dir: Path, *, array: bool = False) -> Dispatch:
        # --export=ALL of the clean environment submit_script() gives sbatch: the script's own --export=LIST (for
        # a script sent by hand) implies --get-user-env, which loads the node's login environment and, on Slurm
        # >= 25.05, holds the job where that fails (sbatch(1); SchedMD/slurm CHANGELOG/slurm-25.05.md). A command-
        # line option wins over the script's #SBATCH line.
        return Dispatch(argv=("sbatch", "--parsable", "--export=ALL", str(run_dir / "job.sbatch")))

    def describe(self, dispatch: Dispatch) -> str:
        return "sbatch: " + shlex.join(dispatch.argv or ())

    def schedule(self, plan: Any) -> str:
        assert plan.argv is not None, "an sbatch plan has the command that submits it"
        # no `scontrol write batch_script` here: the run dir's job.sbatch is the very file sbatch read (the argv
        # names it), and one Slurm call fewer is one fewer beside the job's start
        return executors.submit_script(plan.argv)

    def logs(self, run: RunDir, job_id: str, rank: int, stream: str = "out") -> Path | None:
        return run.job_output(job_id)  # one log for the whole job: every rank's stdout and stderr, labelled


class Local:
    kind = "local"
    scheduler = "local"
    summary = "submitit's local executor, on this machine"

    def sweep_refusal(self, recipe: str) -> HpcError | None:
        return UsageError("a sweep runs as a Slurm job array; the local executor has none",
                          fix="submit the sweep to a Slurm cluster (--executor slurm), or submit points one by one")

    def dry_run(self, spec: Any, run_dir: Path, *, array: bool = False) -> Dispatch:
        if spec.nodes != 1:  # planned, so a dry run says it too (it showed "2 nodes x 8 GPUs ... on this machine")
            raise UsageError(f"the local executor runs on this one machine; {spec.nodes} nodes were asked for",
                             fix="use --nodes 1, or plan for a Slurm cluster: --cluster FILE (its config; no Slurm "
                                 "is needed here to plan), --executor sbatch where Slurm is installed")
        return Dispatch(python=sys.executable, parameters=executors.local_parameters(spec))

    def describe(self, dispatch: Dispatch) -> str:
        return f"submitit's local executor on this machine ({dispatch.python})"

    def check(self, plan: Any) -> None:
        return None  # no scheduler to ask: the executor refuses what one machine cannot run when it submits

    def schedule(self, plan: Any) -> str:
        return executors.submit_submitit(plan.spec, plan.run_dir, plan.parameters, plan.python, local=True)

    def status(self, job_ids: list[str], run: RunDir | None) -> dict[str, JobStatus]:
        return {job_id: JobStatus(job_id, self._state(job_id, run), "local") for job_id in job_ids}

    @staticmethod
    def _state(job_id: str, run: RunDir | None) -> State:
        """RUNNING while submitit's controller (job id = its pid) lives: it waits for every rank
        (submitit/local/_local.py, Controller.wait, pinned 1.5.4), so rank 0's result alone does not end the job.
        Once it is gone: its run dir's result (rank 0's, else a failed rank's record); none is a failure."""
        if _controller_alive(job_id):
            return State.RUNNING
        outcome = run.outcome() if run else None
        if outcome is None:
            return State.FAILED  # gone without rank 0's result
        return State.COMPLETED if outcome else State.FAILED

    def cancel(self, job_ids: list[str]) -> None:
        """SIGTERM to submitit's process of each job (its id is that pid), as scancel's default signal; never to
        a process that has taken the pid since the job ended."""
        for job_id in job_ids:
            if not _controller_alive(job_id):
                continue  # already gone
            try:
                os.kill(int(job_id), signal.SIGTERM)
            except ProcessLookupError:
                pass  # ended in between

    def logs(self, run: RunDir, job_id: str, rank: int, stream: str = "out") -> Path | None:
        return run.rank_log(job_id, rank, stream)


def _controller_alive(job_id: str) -> bool:
    """Whether submitit's local controller process still runs. Where this process started it (`--wait`), an
    ended controller is our zombie until reaped, and a zombie still answers kill(pid, 0): reap it first."""
    try:
        pid = int(job_id)
    except ValueError:
        return False
    try:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return False  # our child, just reaped
    except ChildProcessError:
        pass  # not our child (another hpc process started it), or not one that has ended
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False  # gone, or another user's process took its pid (the controller runs as its submitter)
    try:  # Linux: a process of ours that took the pid since is not the controller
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc here: the pid lives
    if cmdline:
        return b"submitit.local._local" in cmdline
    # Empty: a process still in its exec (measured here: right after Popen returns, half the time), whose exe
    # link is there; or a zombie or a kernel thread (which may take any pid), whose is not.
    try:
        os.readlink(f"/proc/{pid}/exe")
        return True
    except OSError:
        return False
