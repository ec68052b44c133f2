"""The per-rank callable submitit runs under srun (one task per rank): it launches the workload's argv.

submitit unpickles this on the node, so the node's toolkit must be the one that submitted: checked first.
The argv is toolkit.job.rank.resolve_argv(), the same function behind the rendered sbatch script's ranks.
It carries only what a rank needs (toolkit.job.rank: no pydantic, no Jinja2), since every rank pays for the
imports its unpickling triggers.

Preemption and time limits: Slurm sends SIGUSR2 to every process of the job's steps (submitit's
`--signal=USR2@N`; USR1 is NCCL's). A workload that stops on it (our trainers: agreed step, checkpoint,
exit 75) is left to do so; any other workload starts with SIGUSR2 ignored, since its default action kills.
Then rank 0 requeues the job and the rerun resumes from the workload's checkpoint. `scontrol requeue`
sends no SIGUSR2 (Slurm stops the steps itself): the rerun resumes from the last periodic checkpoint.
Benchmarks (JobSpec.requeue false) ignore SIGUSR2 and run to their end or their time limit: never requeued.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import signal
import subprocess
import sys

from toolkit.job.rank import Arg, RankVar, master_port, resolve_argv
from toolkit.workloads.stopping import EXIT_STOPPED  # standard library only: cheap for every rank


class RankFailed(RuntimeError):
    """A rank's workload exited non-zero (the message names the rank, exit code and log)."""


@dataclasses.dataclass(frozen=True)
class RankLauncher:
    command: tuple[Arg, ...]
    world_size: int  # Slurm tasks (SLURM_NTASKS): the ranks, or the nodes under torchrun
    run_dir: str
    toolkit_version: str
    stops_on_signal: bool = False
    requeue: bool = True
    # Local executor only: the whole environment of the workload (submitit's local processes inherit the
    # submitter's, which a job must never see). Under Slurm the batch script already made it explicit.
    local_env: tuple[tuple[str, str], ...] | None = None

    @classmethod
    def for_spec(cls, spec, run_dir, toolkit_version: str, local_env=None) -> RankLauncher:
        """What a rank of this toolkit.job.spec.JobSpec needs, and nothing more."""
        return cls(spec.command, spec.nodes * spec.slurm_tasks_per_node, str(run_dir), toolkit_version,
                   spec.stops_on_signal, spec.requeue, local_env)

    def rank_env(self) -> dict[str, str]:
        """This task's per-rank values, named as the rendered script's tasks see them."""
        import submitit

        job = submitit.JobEnvironment()
        if self.local_env is not None:
            addr, port = "127.0.0.1", str(master_port(int(job.job_id)))
        else:  # exported by the batch script's set-up (toolkit/job/templates/setup.sh.j2)
            addr, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
        return {RankVar.RANK.value: str(job.global_rank), RankVar.LOCAL_RANK.value: str(job.local_rank),
                RankVar.MASTER_ADDR.value: addr, RankVar.MASTER_PORT.value: port}

    def __call__(self) -> str:
        from toolkit import __version__

        if __version__ != self.toolkit_version:
            raise RuntimeError(f"toolkit {__version__} on {os.uname().nodename} is not the toolkit "
                               f"{self.toolkit_version} that submitted this job: install the same version in the "
                               "nodes' training environment and submit again")
        rank = self.rank_env()
        if self.local_env is None:
            env = dict(os.environ)
        else:
            env = dict(self.local_env)
            env.update({"SLURM_PROCID": rank[RankVar.RANK.value], "SLURM_LOCALID": rank[RankVar.LOCAL_RANK.value],
                        "SLURM_NTASKS": str(self.world_size)})
            # torchrun's rendezvous, as the batch script's set-up exports it under Slurm (setup.sh.j2)
            env.update({"PET_RDZV_ENDPOINT": f"{rank[RankVar.MASTER_ADDR.value]}:{rank[RankVar.MASTER_PORT.value]}",
                        "PET_RDZV_ID": "local"})
        env.update({RankVar.MASTER_ADDR.value: rank[RankVar.MASTER_ADDR.value],
                    RankVar.MASTER_PORT.value: rank[RankVar.MASTER_PORT.value]})
        argv = resolve_argv(self.command, rank)
        global_rank = int(rank[RankVar.RANK.value])
        returncode, stop_requested = _run(argv, env, self.stops_on_signal, self.requeue)
        record = {"rank": global_rank, "host": os.uname().nodename, "exit_code": returncode,
                  "argv0": argv[0], "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        if stop_requested:  # SIGUSR2: the time limit is near, or a preemption notice
            if global_rank == 0 and self.local_env is None:
                _requeue(os.environ["SLURM_JOB_ID"])
            return "stopped: requeued"
        if returncode == EXIT_STOPPED:  # SIGTERM: Slurm is ending or requeueing the job itself
            return "stopped"
        if returncode != 0:
            _write(self.run_dir, record)
            raise RankFailed(f"rank {global_rank}: {argv[0]} exited with {returncode}")
        if global_rank == 0:
            _write(self.run_dir, {**record, "ok": True})
        return "completed"


def _write(run_dir: str, record: dict) -> None:
    """Rank 0's result.json when the workload ended well, else this rank's failures/rank-N.json."""
    from toolkit.rundir import RankRecord, RunDir

    run, rank = RunDir(run_dir), RankRecord.from_json(record)
    if rank.ok:
        run.write_result(rank)
    else:
        run.write_failure(rank)


def _requeue(job_id: str) -> None:
    """Put this job back in the queue (Slurm stops what still runs of it and starts it again)."""
    sys.stderr.write(f"hpc: stop requested: requeueing job {job_id}\n")
    subprocess.run(["scontrol", "requeue", job_id], timeout=60, check=False)


def _ignore_usr2() -> None:
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # kept across exec: the workload never dies of it


def _run(argv: list[str], env: dict[str, str], stops_on_signal: bool, requeue: bool = True) -> tuple[int, bool]:
    """Run the workload to its end; (exit code, whether a stop (SIGUSR2) was requested meanwhile).

    SIGUSR2 and SIGTERM reach the workload from Slurm directly (it signals every process of the step);
    they are passed on too, for signals sent to this process alone. Without requeue, SIGUSR2 means nothing.
    """
    stops_on_signal = stops_on_signal and requeue
    try:
        proc = subprocess.Popen(argv, env=env, preexec_fn=None if stops_on_signal else _ignore_usr2)
    except FileNotFoundError:
        sys.stderr.write(f"hpc: {argv[0]!r} was not found on PATH={env.get('PATH', '')}\n")
        return 127, False
    stop = {"requested": False}

    def on_usr2(_signum, _frame) -> None:
        if not requeue:
            return
        stop["requested"] = True
        if stops_on_signal:
            proc.send_signal(signal.SIGUSR2)
        elif proc.poll() is None:
            proc.terminate()  # it cannot save on request: end it; the rerun resumes from its last checkpoint

    previous = {signal.SIGUSR2: signal.signal(signal.SIGUSR2, on_usr2),
                signal.SIGTERM: signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))}
    try:
        return proc.wait(), stop["requested"]
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
