"""`hpc jobs logs` and `--wait`'s failed-rank hint for a job sent as its sbatch script (MPI binaries), on the real
local Slurm: its one log is `<run dir>/<job name>-<job id>.out`, not submitit's per-rank files, every line labelled
by srun with its task (`--rank` picks one). (The local Slurm has no PMIx library, so the MPI step fails at once:
Slurm has written the log by then.)"""

from __future__ import annotations

import datetime as dt
import re
import time
from pathlib import Path

import pytest

from tests.conftest import cli_json, run_hpc, slurm_env
from tests.jobhelpers import probe_recipe, write_cluster

pytestmark = pytest.mark.slurm


def test_the_sbatch_executors_log_is_the_jobs_log_and_the_failed_ranks(slurm_sandbox, tmp_path):
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    res = run_hpc("recipes", "submit", str(probe_recipe(tmp_path)), "--cluster", str(write_cluster(tmp_path)),
                  "--queue", "cpu", "--set", "launcher.mpi=pmix", "--set", "resources.time=00:05:00", "--wait",
                  "--json", env=env, timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    result = cli_json(res)
    assert (result["executor"], result["state"]) == ("sbatch", "FAILED")
    log = Path(result["run_dir"]) / f"probe-{result['job_id']}.out"
    assert result["failed_rank_log"] == str(log) and f"(see {log})" in res.stderr
    text = log.read_text()
    assert "pmix" in text  # what srun said, in the job's own log
    logs = run_hpc("jobs", "logs", result["job_id"], env=env)
    assert (logs.returncode, logs.stdout) == (0, text), logs.stderr
    as_json = cli_json(run_hpc("jobs", "logs", result["job_id"], "--json", env=env))  # the same lines, one envelope
    assert (as_json["rank"], as_json["stream"], as_json["lines"]) == (0, "out", text.splitlines())
    # one log holds every rank's stdout and stderr
    assert run_hpc("jobs", "logs", result["job_id"], "--rank", "3", "--stderr", env=env).stdout == text


def test_jobs_logs_rank_picks_one_ranks_lines_of_the_rendered_scripts_one_log(slurm_sandbox, tmp_path):
    # 2 nodes x 2 ranks write to one log (the rendered script's #SBATCH --output); srun --label tells them apart
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    sent = time.time()
    res = run_hpc("recipes", "submit", str(probe_recipe(tmp_path)), "--cluster", str(write_cluster(tmp_path)),
                  "--queue", "cpu", "--executor", "sbatch", "--set", "resources.time=00:05:00", "--wait", "--json",
                  env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    result = cli_json(res)
    text = (Path(result["run_dir"]) / f"probe-{result['job_id']}.out").read_text()
    # the job's first line says when it ran, to the millisecond in UTC (benchmarks/bench_submit.py reads it)
    when = re.search(rf"^hpc: job {result['job_id']} at (\S+Z): 2 nodes x 2 ranks, rendezvous c1:", text, re.M)
    assert when, text
    assert sent < dt.datetime.strptime(when.group(1), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp() < time.time()
    assert sorted(line.split(" on ")[0] for line in text.splitlines() if "probe rank" in line) == \
        [f"{rank}: probe rank {rank}" for rank in range(4)]
    for rank, node in [(0, "c1"), (2, "c2")]:
        logs = run_hpc("jobs", "logs", result["job_id"], "--rank", str(rank), env=env)
        assert logs.returncode == 0, logs.stderr
        # only that rank's line, unlabelled (5 args: --text T, --count 3, --flag)
        probe_lines = [line for line in logs.stdout.splitlines() if "probe" in line]
        assert probe_lines == [f"probe rank {rank} on {node}: 5 args"]
