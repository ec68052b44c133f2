"""`hpc jobs status` of a job that failed names what `--wait` names: the rank that failed first, its log, and the
command that prints its lines (a fault probe: status said only FAILED and exit code 15:0, the batch shell's)."""

from __future__ import annotations

import os
import subprocess

from tests.conftest import cli_json, run_hpc
from toolkit.rundir import Metadata, RunDir

# The job's one log as the rendered script's srun --label wrote it on the local cluster (job 1999, this session):
# rank 1 exited 7, and srun ended the others.
LOG = """hpc: job 4242 at 2026-11-29T19:59:40.622Z: 2 nodes x 2 ranks, rendezvous c1:16999
hpc: pre-flight: 2 node(s) passed in 0.4 s
1: boom on rank 1
srun: error: c1: task 1: Exited with exit code 7
srun: launch/slurm: _step_signal: Terminating StepId=4242.0
0: slurmstepd-c1: error: *** STEP 4242.0 ON c1 CANCELLED AT 2026-11-29T19:59:41 ***
srun: error: c1: task 0: Terminated
srun: error: c2: tasks 2-3: Terminated
"""


def _stand_in_sacct(monkeypatch, row: str) -> None:
    """sacct's answer for the job (a stand-in: the run dir and its log are what is read for real)."""
    def run(args, timeout=20.0, check=True, input=None):
        return subprocess.CompletedProcess(args, 0, row if args[0] == "sacct" else "", "")
    monkeypatch.setattr("toolkit.slurm.commands.run", run)


def test_a_failed_jobs_status_names_its_first_failed_rank_and_how_to_read_its_lines(tmp_path, monkeypatch):
    run = RunDir(tmp_path / "runs" / "probe-x").create()
    run.write_metadata(Metadata.from_json({"recipe": "probe", "executor": "sbatch", "job_ids": ["4242"], "nodes": 2,
                                           "ranks": 4}))
    log = run.path / "probe-4242.out"
    log.write_text(LOG)
    _stand_in_sacct(monkeypatch, "4242|FAILED|15:0|00:00:02|c[1-2]|None\n")
    env = {**os.environ, "HPC_RUNS_DIR": str(tmp_path / "runs")}
    res = run_hpc("jobs", "status", "4242", env=env)
    assert res.returncode == 1
    assert (f"job 4242 ended FAILED: rank 1 on c1 failed first (see {log}; rank 1's lines: hpc jobs logs 4242 "
            "--rank 1)" in res.stderr)
    data = cli_json(run_hpc("jobs", "status", "4242", "--json", env=env))
    assert (data["failed_rank"], data["failed_node"], data["failed_rank_log"]) == (1, "c1", str(log))
    _stand_in_sacct(monkeypatch, "4242|COMPLETED|0:0|00:00:02|c[1-2]|None\n")  # a job that completed names none
    done = run_hpc("jobs", "status", "4242", "--json", env=env)
    assert done.returncode == 0 and "failed_rank" not in cli_json(done)


def test_ctrl_c_while_following_keeps_the_job_id_and_says_the_job_goes_on(tmp_path, monkeypatch):
    """A fault probe pressed Ctrl-C under `--wait --json`: the envelope was `data: null`, the id of a job still
    running lost. (Stand-ins for the submission and its wait: what is tested is the CLI's answer to the interrupt.)"""
    from toolkit.submit import submission

    submitted = {"job_id": "77", "run_dir": str(tmp_path / "run"), "executor": "sbatch", "queue": "cpu", "nodes": 2,
                 "ranks": 4, "warnings": []}

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(submission, "submit", lambda request, progress=None: dict(submitted))
    monkeypatch.setattr(submission, "wait", interrupted)
    res = run_hpc("recipes", "submit", "resnet50", "--profile", "smoke", "--wait", "--json",
                  env={**os.environ, "HPC_RUNS_DIR": str(tmp_path / "runs")})
    assert res.returncode == 130
    envelope = __import__("json").loads(res.stdout)
    assert envelope["data"]["job_id"] == "77" and envelope["data"]["run_dir"] == submitted["run_dir"]
    assert "stopped following job 77; it goes on" in envelope["error"]["message"]
    assert "hpc jobs cancel 77" in envelope["error"]["fix"]


def test_a_job_slurm_knows_without_its_run_dir_here_says_what_is_not_read(tmp_path, monkeypatch):
    """A fault probe deleted a running job's run dir: status said COMPLETED and dropped the run's lines without a
    word."""
    _stand_in_sacct(monkeypatch, "4243|COMPLETED|0:0|00:00:02|c1|None\n")
    (tmp_path / "runs").mkdir()
    res = run_hpc("jobs", "status", "4243", env={**os.environ, "HPC_RUNS_DIR": str(tmp_path / "runs")})
    assert res.returncode == 0 and "job 4243: COMPLETED" in res.stdout
    assert f"no run dir in {tmp_path / 'runs'} records job 4243: its logs, heartbeats and result are not read" \
        in res.stderr


def test_a_python_traceback_on_the_failed_rank_is_named_by_its_exception_line(tmp_path, monkeypatch):
    """A fault probe's rank 1 raised KeyError: the failure named the rank and the log, not the error."""
    run = RunDir(tmp_path / "runs" / "probe-y").create()
    run.write_metadata(Metadata.from_json({"recipe": "probe", "executor": "sbatch", "job_ids": ["4244"], "nodes": 2,
                                           "ranks": 4}))
    (run.path / "probe-4244.out").write_text(
        "0: step 1\n1: Traceback (most recent call last):\n1:   File \"/fsx/train.py\", line 9, in <module>\n"
        "1:     batch = sizes['b']\n1:             ~~~~~^^^^^\n1: KeyError: 'b'\n0: KeyError: 'not rank 1'\n"
        "srun: error: c1: task 1: Exited with exit code 1\nsrun: error: c1: task 0: Terminated\n")
    _stand_in_sacct(monkeypatch, "4244|FAILED|1:0|00:00:02|c[1-2]|None\n")
    res = run_hpc("jobs", "status", "4244", env={**os.environ, "HPC_RUNS_DIR": str(tmp_path / "runs")})
    assert res.returncode == 1 and "job 4244 ended FAILED: rank 1 on c1 failed first: KeyError: 'b' (see " in res.stderr


def _stand_in_slurm(monkeypatch, sacct: str, squeue: str, calls: list | None = None) -> None:
    """sacct's and squeue's answers (stand-ins: what is tested is which one hpc believes)."""
    def run(args, timeout=20.0, check=True, input=None):
        if calls is not None:
            calls.append(args[0])
        return subprocess.CompletedProcess(args, 0, {"sacct": sacct, "squeue": squeue}.get(args[0], ""), "")
    monkeypatch.setattr("toolkit.slurm.commands.run", run)


def test_the_controllers_newer_word_wins_over_accountings_lag(tmp_path, monkeypatch):
    """slurmdbd hears of an end after slurmctld: a full run here saw `jobs status` say PENDING for a job whose
    launch had failed (squeue: FAILED). Accounting's requeue count stays; a job it lacks (just submitted) is the
    controller's; an end accounting has seen is not asked again."""
    from toolkit.slurm import status

    env = {**os.environ, "HPC_RUNS_DIR": str(tmp_path / "runs")}
    (tmp_path / "runs").mkdir()
    _stand_in_slurm(monkeypatch, "4245|FAILED|0:0|00:00:01|c1|None\n4245|PENDING|0:0|00:00:00||None\n",
                    "4245|FAILED|c1|0:01|NonZeroExitCode\n")
    data = cli_json(run_hpc("jobs", "status", "4245", "--json", env=env))
    assert (data["state"], data["source"], data["requeues"]) == ("FAILED", "squeue", 1)
    _stand_in_slurm(monkeypatch, "", "4246|RUNNING|c[1-2]|0:03|None\n")
    assert status.query(["4246"])["4246"].state == status.State.RUNNING
    calls: list = []
    _stand_in_slurm(monkeypatch, "4247|COMPLETED|0:0|00:00:02|c1|None\n", "4247|COMPLETING|c1|0:02|None\n", calls)
    assert status.query(["4247"])["4247"].state == status.State.COMPLETED and calls == ["sacct"]
    _stand_in_slurm(monkeypatch, "4248|PENDING|0:0|00:00:00||Priority\n", "")  # the controller forgot it: as is
    assert status.query(["4248"])["4248"].state == status.State.PENDING
