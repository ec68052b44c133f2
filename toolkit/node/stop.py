"""The stop policy: what a job does when Slurm says stop. One description per job, from which every path is made.

Slurm asks a job to stop with SIGNAL before its time limit (sbatch --signal, `before_s` ahead; also on
`scancel --signal=USR2 --batch`); `scontrol requeue`, scancel and preemption send SIGTERM. A job's StopPolicy
(toolkit.job.spec.JobSpec.stop) answers each path's question:

  requeue  saves_on_signal   Slurm asks for              the rendered script       submitit (toolkit.slurm.rank_task)
  yes      yes (trainers)    --requeue,                  trap: pass SIGNAL to      checkpoint() waits for rank 0's
                             --signal=B:USR2@N (script)  srun, then requeue once   workload to save (exit 75), then
                             --signal=USR2@N (submitit)  it ended                  requeues; the workload gets SIGNAL
  yes      no (the rest)     as above                    trap: `scontrol requeue`  checkpoint() ends rank 0's
                                                         at once                   workload, then requeues; the
                                                                                   workload starts with SIGNAL ignored
  no       either (benchm.)  --no-requeue; the script    no trap                   checkpoint() answers None (not
                             asks for no signal                                    requeued); SIGNAL ignored

submitit always asks for the signal on the steps (its own option, here set from step_signal). The workload that
saves exits EXIT_STOPPED; `scontrol requeue`'s SIGTERM makes it save too, and the rerun resumes from there. The
spares supervisor (toolkit.node.spares), run by the rendered script in place of srun, passes STOP_SIGNALS on to its
round's srun and counts a rank's EXIT_STOPPED as a stop, not a failure; it gets the policy as `--stop JSON`.

Node-side code (toolkit.node's contract): standard library only, Python 3.9.
"""

from __future__ import annotations

import dataclasses
import json
import signal
from typing import ClassVar

from .rank import EXIT_STOPPED

# Slurm's signal before the time limit: USR1 is NCCL's; submitit's default (SUBMITIT_PREEMPT_SIGNAL) is the same.
SIGNAL = "USR2"
# What asks a job to stop: SIGNAL, and the SIGTERM of scancel, `scontrol requeue` and preemption.
STOP_SIGNALS = (SIGNAL, "TERM")


def signal_number(name: str) -> signal.Signals:
    """A signal's number from its name without SIG (USR2 -> SIGUSR2)."""
    return signal.Signals["SIG" + name]


@dataclasses.dataclass(frozen=True)
class StopPolicy:
    # The defaults are a recipe's (toolkit.recipes.schema: resources.requeue, launcher.stops_on_signal,
    # resources.signal_before_s; tests/test_stop_policy.py compares them).
    requeue: bool = True  # False for benchmarks: no signal before the time limit, never requeued
    saves_on_signal: bool = False  # the workload saves and exits EXIT_STOPPED on SIGNAL (our trainers)
    before_s: int = 120  # SIGNAL this long before the time limit: the workload's time to save
    # The same for every job: the workloads and submitit's handler know them, not the recipe.
    signal: ClassVar[str] = SIGNAL
    exit_stopped: ClassVar[int] = EXIT_STOPPED

    @property
    def saves_then_requeues(self) -> bool:
        """The workload gets SIGNAL, saves and exits; the job is requeued after it ended."""
        return self.requeue and self.saves_on_signal

    # -- what Slurm is asked for ---------------------------------------------------------------------------------

    @property
    def requeue_option(self) -> str:
        """sbatch's requeue option, explicit both ways: Slurm's own default (JobRequeue=1) would requeue a
        benchmark after a node failure."""
        return "requeue" if self.requeue else "no-requeue"

    @property
    def batch_signal(self) -> str | None:
        """The rendered script's `--signal`: to the batch shell only (B:), whose trap decides; none for a job that
        is never requeued (one hung on a bad fabric ends at its time limit)."""
        return f"B:{self.signal}@{self.before_s}" if self.requeue else None

    @property
    def step_signal(self) -> str:
        """submitit's `--signal`: to every process of the steps, whose per-rank handler calls checkpoint()."""
        return f"{self.signal}@{self.before_s}"

    # -- the rendered script's trap ------------------------------------------------------------------------------

    @property
    def trap_action(self) -> str:
        """What the batch shell's trap does on SIGNAL: "forward" it to srun (the workload saves), "requeue" the job
        at once (it cannot save), or "none" (no trap: never requeued)."""
        if not self.requeue:
            return "none"
        return "forward" if self.saves_on_signal else "requeue"

    @property
    def requeue_after_step(self) -> bool:
        """Whether the batch shell requeues the job once srun ended on a stop (the trap did not already)."""
        return self.trap_action == "forward"

    # -- submitit's checkpoint protocol --------------------------------------------------------------------------

    @property
    def checkpoint_requeues(self) -> bool:
        """Whether checkpoint() answers with a resubmission (else None: submitit ends the job, not requeued)."""
        return self.requeue

    @property
    def checkpoint_ends_workload(self) -> bool:
        """Whether checkpoint() ends rank 0's workload before requeueing (it cannot save on request), rather than
        waiting for it to save."""
        return self.requeue and not self.saves_on_signal

    # -- the workload and the supervisor -------------------------------------------------------------------------

    @property
    def workload_ignores_signal(self) -> bool:
        """Whether the workload starts with SIGNAL ignored (its default action kills): unless it saves on it."""
        return not self.saves_then_requeues

    @property
    def forwarded_signals(self) -> tuple[str, ...]:
        """The signals the spares supervisor passes on to its round's srun: the trap's SIGNAL, Slurm's SIGTERM."""
        return STOP_SIGNALS

    def stopped(self, exit_code: int | None) -> bool:
        """Whether a rank's exit status says it saved and stopped on request (no failure)."""
        return exit_code == self.exit_stopped

    # -- to the node ---------------------------------------------------------------------------------------------

    def to_json(self) -> str:
        """The policy as the node-side commands take it (`--stop`)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> StopPolicy:
        data = json.loads(text)
        fields = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, dict) or set(data) != fields:
            raise ValueError(f"a stop policy is a JSON object with exactly {', '.join(sorted(fields))}: {text}")
        if not all(isinstance(data[name], bool) for name in ("requeue", "saves_on_signal")) or \
                type(data["before_s"]) is not int:
            raise ValueError(f"a stop policy's requeue and saves_on_signal are booleans, before_s an integer: {text}")
        return cls(**data)
