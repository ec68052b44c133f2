"""The per-rank callable submitit runs on every Slurm task: the job's rank program (toolkit.job.rank), as a child.

The rank program is the argv the rendered script's srun line runs, so both submission paths give every rank the
same contract, argv and environment. What is submitit's stays submitit's: its per-rank process installs its own
signal handlers (submitit/core/job_environment.py: SIGUSR2 -> `checkpoint_and_try_requeue` on rank 0, SIGTERM
logged and bypassed), and this callable answers submitit's checkpoint protocol (`checkpoint()` returning a
DelayedSubmission to requeue, None not to).

The stop policy, one per job (JobSpec.requeue, JobSpec.stops_on_signal), as each path carries it out. Slurm
sends SIGUSR2 signal_before_s before the time limit (USR1 is NCCL's): on the submitit path to every process of
the steps (`--signal=USR2@N`), so the workload gets it directly; the rendered script's batch shell gets it
(`--signal=B:USR2@N`) and its trap passes it to srun, which signals every task.

  requeue, stops_on_signal (our trainers)  the workload agrees on a step, saves, exits 75; then the job requeues
                                           (script: the trap, after srun ends; submitit: checkpoint() waits for
                                           rank 0's workload, submitit runs `scontrol requeue`)
  requeue, cannot save (most programs)     the workload starts with SIGUSR2 ignored; the job requeues at once and
                                           the rerun resumes from its last periodic checkpoint (checkpoint() ends
                                           rank 0's workload first)
  no requeue (benchmarks)                  the workload ignores SIGUSR2 and the job is never requeued (script: no
                                           signal is asked for; submitit always asks, and checkpoint() answers
                                           None: submitit ends the job as not requeued)

`scontrol requeue` sends SIGTERM (no SIGUSR2): workloads that save on it exit 75, the rerun resumes from there.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import signal
import subprocess
import sys
import threading

from toolkit.node.rank import EXIT_STOPPED  # standard library only: cheap for every rank

# How long checkpoint() gives a stopping workload to save before requeueing without it.
STOP_GRACE_S = 120

_running: dict[str, object] = {}  # this process's workload ("proc", "ended"), for checkpoint()


class RankFailed(RuntimeError):
    """A rank's workload exited non-zero (the message names the rank, exit code and log)."""


@dataclasses.dataclass(frozen=True)
class RankTask:
    argv: tuple[str, ...]  # the job's rank program (toolkit.job.rank.RankProgram.argv)
    ntasks: int  # Slurm tasks: the ranks, or the nodes under torchrun
    run_dir: str
    toolkit_version: str
    stops_on_signal: bool = False
    requeue: bool = True
    # Local executor only: the whole environment of the workload (submitit's local processes inherit the
    # submitter's, which a job must never see). Under Slurm the batch script already made it explicit.
    local_env: tuple[tuple[str, str], ...] | None = None

    @classmethod
    def for_spec(cls, spec, run_dir, toolkit_version: str, local_env=None) -> RankTask:
        """What a task of this toolkit.job.spec.JobSpec runs, and nothing more."""
        from toolkit.slurm.render import slurm_part

        return cls(spec.program.argv, spec.nodes * slurm_part(spec).tasks_per_node, str(run_dir), toolkit_version,
                   spec.stops_on_signal, spec.requeue, local_env)

    @property
    def program(self) -> str:
        """The workload's program: the rank program's first word after `bash -c SCRIPT`."""
        return self.argv[3] if len(self.argv) > 3 else self.argv[0]

    def environment(self) -> dict[str, str]:
        """The task's environment. Under Slurm: this process's (the batch script's set-up and srun's task
        variables). Locally: the explicit one, with the task variables the rank program reads, as srun sets them."""
        if self.local_env is None:
            return dict(os.environ)
        from toolkit.job.rank import master_port
        import submitit

        job = submitit.JobEnvironment()
        addr, port = "127.0.0.1", str(master_port(int(job.job_id)))
        return {**dict(self.local_env), "SLURM_PROCID": str(job.global_rank), "SLURM_LOCALID": str(job.local_rank),
                "SLURM_NODEID": "0", "SLURM_NTASKS": str(self.ntasks), "MASTER_ADDR": addr, "MASTER_PORT": port,
                # torchrun's rendezvous, as the batch script's set-up exports it under Slurm (setup.sh.j2)
                "PET_RDZV_ENDPOINT": f"{addr}:{port}", "PET_RDZV_ID": "local"}

    def __call__(self) -> str:
        from toolkit import __version__

        if __version__ != self.toolkit_version:
            raise RuntimeError(f"toolkit {__version__} on {os.uname().nodename} is not the toolkit "
                               f"{self.toolkit_version} that submitted this job: install the same version in the "
                               "nodes' training environment and submit again")
        env = self.environment()
        rank = int(env["SLURM_PROCID"])
        returncode = _run(list(self.argv), env, ignore_usr2=not (self.stops_on_signal and self.requeue))
        record = {"rank": rank, "host": os.uname().nodename, "exit_code": returncode, "argv0": self.program,
                  "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        if returncode == EXIT_STOPPED:  # saved on a stop signal; Slurm or rank 0 requeues the job
            return "stopped"
        if returncode != 0:
            _write(self.run_dir, record)
            raise RankFailed(f"rank {rank}: {self.program} exited with {returncode}")
        if rank == 0:
            _write(self.run_dir, {**record, "ok": True})
        return "completed"

    def checkpoint(self, *args, **kwargs):
        """submitit's checkpoint protocol, called on rank 0 when the stop signal arrives: requeue the job (return
        a DelayedSubmission) once this rank's workload has saved or been ended, or not at all (None)."""
        if not self.requeue:
            return None
        proc, ended = _running.get("proc"), _running.get("ended")
        if isinstance(proc, subprocess.Popen) and isinstance(ended, threading.Event):
            if not self.stops_on_signal:
                proc.terminate()  # it cannot save on request: the rerun resumes from its last checkpoint
            if not ended.wait(STOP_GRACE_S):
                proc.kill()
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def _write(run_dir: str, record: dict) -> None:
    """Rank 0's result.json when the workload ended well, else this rank's failures/rank-N.json."""
    from pathlib import Path

    from toolkit.rundir import RankRecord, RunDir

    run, rank = RunDir(Path(run_dir)), RankRecord.from_json(record)
    if rank.ok:
        run.write_result(rank)
    else:
        run.write_failure(rank)


def _ignore_usr2() -> None:
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # kept across exec: the workload never dies of it


def _run(argv: list[str], env: dict[str, str], ignore_usr2: bool) -> int:
    """Run the workload to its end and return its exit code. A thread waits for it, so that submitit's signal
    handlers (and checkpoint()) run in this main thread while it runs."""
    try:
        proc = subprocess.Popen(argv, env=env, preexec_fn=_ignore_usr2 if ignore_usr2 else None)
    except FileNotFoundError:
        sys.stderr.write(f"hpc: {argv[0]!r} was not found on PATH={env.get('PATH', '')}\n")
        return 127
    ended = threading.Event()

    def wait_for_the_end() -> None:
        proc.wait()
        ended.set()
    threading.Thread(target=wait_for_the_end, daemon=True).start()
    _running.update(proc=proc, ended=ended)
    while not ended.wait(1.0):
        pass
    return proc.returncode
