"""`hpc recipes submit` and `hpc jobs` on the real local Slurm: a failing rank, the jobs commands, status without
accounting. (Both submission paths against their plan, rank by rank: tests/test_plan_slurm.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import cli_json, run_hpc, slurm_env
from tests.jobhelpers import probe_recipe

pytestmark = pytest.mark.slurm
def test_a_failing_rank_ends_wait_non_zero_and_names_its_log(slurm_sandbox, tmp_path):
    recipe = probe_recipe(tmp_path, PROBE_FAIL_RANK="3")
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    res = run_hpc("recipes", "submit", str(recipe), "--nodes", "2", "--executor", "slurm", "--wait", env=env,
                  cwd=tmp_path)  # submitit's per-rank logs (the rendered script's one log: the next test)
    assert res.returncode == 1
    assert "Traceback" not in res.stderr
    log = re.search(r"see (\S+_3_log\.err)", res.stderr)
    assert log, res.stderr
    assert "failing on purpose" in Path(log.group(1)).read_text()
    job_id = res.stdout.split()[0]
    status = run_hpc("jobs", "status", job_id, "--json", env=env)
    assert status.returncode == 1 and cli_json(status)["state"] == "FAILED"



def test_a_failing_rank_of_the_rendered_script_is_named_from_its_one_log(slurm_sandbox, tmp_path):
    """The rendered script's ranks share the job's one log and write no records: --wait names the rank srun saw
    exit first (not one it killed after) and the command that prints that rank's lines, which hold its error."""
    recipe = probe_recipe(tmp_path, PROBE_FAIL_RANK="3")
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    res = run_hpc("recipes", "submit", str(recipe), "--nodes", "2", "--executor", "sbatch", "--wait", env=env,
                  cwd=tmp_path)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    job_id = res.stdout.split()[0]
    # rank 3 is the second node's second task: its node is the one srun named
    named = re.search(rf"job {job_id} ended FAILED: rank 3 on c2 failed first \(see (\S+-{job_id}\.out); rank 3's "
                      rf"lines: hpc jobs logs {job_id} --rank 3\)", res.stderr)
    assert named, res.stderr
    lines = run_hpc("jobs", "logs", job_id, "--rank", "3", env=env)
    assert lines.returncode == 0 and "failing on purpose" in lines.stdout
    assert "failing on purpose" not in run_hpc("jobs", "logs", job_id, "--rank", "1", env=env).stdout

def test_jobs_commands_on_a_finished_run(slurm_sandbox, tmp_path):
    recipe = probe_recipe(tmp_path)
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    res = run_hpc("recipes", "submit", str(recipe), "--nodes", "2", "--wait", "--json", env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    job_id = cli_json(res)["job_id"]
    listed = cli_json(run_hpc("jobs", "list", "--json", env=env))
    assert [(r["job_id"], r["state"], r["recipe"]) for r in listed] == [(job_id, "COMPLETED", "probe")]
    logs = run_hpc("jobs", "logs", job_id, "--rank", "2", env=env)
    assert logs.returncode == 0 and "probe rank 2 on c2" in logs.stdout
    missing = run_hpc("jobs", "logs", job_id, "--rank", "9", env=env)
    assert missing.returncode == 1 and "rank 9" in missing.stderr and "Traceback" not in missing.stderr
    unknown = run_hpc("jobs", "status", "999999", env=env)
    assert unknown.returncode == 1 and "999999" in unknown.stderr


@pytest.mark.parametrize("executor", ["slurm", "sbatch"])
def test_sacct_less_status_falls_back_to_squeue_scontrol_and_the_run_dir(slurm_sandbox, tmp_path, monkeypatch,
                                                                         executor):
    """ParallelCluster ships without accounting: with sacct failing, status still comes out right, on either
    executor (the run dir's record: submitit's rank 0's, the rendered script's batch shell's)."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "sacct").write_text("#!/bin/sh\necho 'sacct: error: Slurm accounting storage is disabled' >&2\n"
                                    "exit 1\n")
    (fake_bin / "sacct").chmod(0o755)
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    env["PATH"] = f"{fake_bin}:{env['PATH']}"
    recipe = probe_recipe(tmp_path)
    res = run_hpc("recipes", "submit", str(recipe), "--nodes", "2", "--executor", executor, "--wait", "--json",
                  env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    job_id = cli_json(res)["job_id"]
    status = cli_json(run_hpc("jobs", "status", job_id, "--json", env=env))
    assert status["state"] == "COMPLETED" and status["source"] in ("squeue", "scontrol")
    # Once Slurm has forgotten the job (MinJobAge), the run dir still knows how it ended.
    from toolkit.submit import runs

    monkeypatch.setenv("HPC_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr("toolkit.slurm.status.query", lambda ids: {})
    assert runs.status(job_id).state == "COMPLETED" and runs.status(job_id).source == "run-dir"
