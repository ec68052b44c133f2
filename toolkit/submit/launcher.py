"""The per-rank callable submitit runs under srun (one task per rank): it launches the workload's argv.

submitit unpickles this on the node, so the node's toolkit must be the one that submitted: checked first.
The argv is toolkit.job.rank.resolve_argv(), the same function behind the rendered sbatch script's ranks.
It carries only what a rank needs (toolkit.job.rank: no pydantic, no Jinja2), since every rank pays for the
imports its unpickling triggers.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import signal
import subprocess
import sys
from pathlib import Path

from toolkit.job.rank import Arg, RankVar, master_port, resolve_argv


class RankFailed(RuntimeError):
    """A rank's workload exited non-zero (the message names the rank, exit code and log)."""


@dataclasses.dataclass(frozen=True)
class RankLauncher:
    command: tuple[Arg, ...]
    world_size: int
    run_dir: str
    toolkit_version: str
    # Local executor only: the whole environment of the workload (submitit's local processes inherit the
    # submitter's, which a job must never see). Under Slurm the batch script already made it explicit.
    local_env: tuple[tuple[str, str], ...] | None = None

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

    def __call__(self) -> int:
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
        env.update({RankVar.MASTER_ADDR.value: rank[RankVar.MASTER_ADDR.value],
                    RankVar.MASTER_PORT.value: rank[RankVar.MASTER_PORT.value]})
        argv = resolve_argv(self.command, rank)
        returncode = _run_forwarding_signals(argv, env)
        global_rank = int(rank[RankVar.RANK.value])
        record = {"rank": global_rank, "host": os.uname().nodename, "exit_code": returncode,
                  "argv0": argv[0], "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        if returncode != 0:
            _write(Path(self.run_dir) / "failures" / f"rank-{global_rank}.json", record)
            raise RankFailed(f"rank {global_rank}: {argv[0]} exited with {returncode}")
        if global_rank == 0:
            _write(Path(self.run_dir) / "result.json", {**record, "ok": True})
        return returncode


def _write(path: Path, record: dict) -> None:
    from toolkit.submit.rundir import write_json

    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, record)


def _run_forwarding_signals(argv: list[str], env: dict[str, str]) -> int:
    """Run the workload; pass SIGTERM/SIGUSR2 on to it (Slurm signals this task, the trainer must hear it)."""
    try:
        proc = subprocess.Popen(argv, env=env)
    except FileNotFoundError:
        sys.stderr.write(f"hpc: {argv[0]!r} was not found on PATH={env.get('PATH', '')}\n")
        return 127
    previous = {}
    for sig in (signal.SIGTERM, signal.SIGUSR2):
        previous[sig] = signal.signal(sig, lambda num, _frame: proc.send_signal(num))
    try:
        return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
