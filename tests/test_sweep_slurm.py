"""Sweeps on the real local Slurm: one job array, every task accounted for, failures visible per task."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_hpc, slurm_env
from tests.jobhelpers import one_rank_cluster, sweep_probe_recipe
from toolkit.slurm import commands

pytestmark = pytest.mark.slurm
TASKS = 200


def sacct_rows(array_id: str, env: dict, expected: int, timeout: float = 60) -> list[list[str]]:
    """Accounting's rows for the array, once it has recorded `expected` of them (it lags the controller)."""
    deadline = time.monotonic() + timeout
    while True:
        res = commands.run(["sacct", "-X", "-n", "-P", "-D", "-j", array_id, "-o", "JobID,State"], check=False)
        rows = [line.split("|") for line in res.stdout.splitlines() if line and "[" not in line]
        if len(rows) >= expected or time.monotonic() > deadline:
            return rows
        time.sleep(1)


def test_a_200_task_sweep_is_one_job_array_with_every_task_accounted_for(slurm_sandbox, tmp_path, monkeypatch):
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    recipe, cluster = sweep_probe_recipe(tmp_path), one_rank_cluster(slurm_sandbox, tmp_path)
    start = time.monotonic()
    res = run_hpc("recipes", "submit", str(recipe), "--cluster", str(cluster), "--queue", "cpu",
                  "--sweep", f"args.--count=1..{TASKS}", "--wait", "--json", env=env, cwd=tmp_path, timeout=600)
    elapsed = time.monotonic() - start
    print(f"\n{TASKS}-task sweep on the local Slurm (2 nodes x 2 CPUs): {elapsed:.0f} s", file=sys.__stdout__)
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    array_id, sweep_dir = result["job_id"], Path(result["run_dir"])
    assert result["state"] == "COMPLETED" and result["tasks"] == TASKS

    # One run dir per task, none lost or doubled, each recording its own task and overrides.
    task_dirs = sorted(p.name for p in sweep_dir.iterdir() if p.name.startswith("task-"))
    assert task_dirs == [f"task-{i:03d}" for i in range(TASKS)]
    for i in range(TASKS):
        meta = json.loads((sweep_dir / f"task-{i:03d}" / "metadata.json").read_text())
        assert (meta["task_index"], meta["array_job_id"], meta["job_ids"]) == (i, array_id, [f"{array_id}_{i}"])
        assert meta["sweep_overrides"] == [f"args.--count={i + 1}"]
        assert json.loads((sweep_dir / f"task-{i:03d}" / "result.json").read_text())["ok"] is True
    # Each task ran exactly once, with its own value.
    probes = sorted((tmp_path / "probe").glob("task-*-rank-*.json"))
    assert len(probes) == TASKS
    for i in range(TASKS):
        assert json.loads((tmp_path / "probe" / f"task-{i}-rank-0.json").read_text())["argv"] == ["--count", str(i + 1)]
    assert len(list((sweep_dir / "submitit").glob(f"{array_id}_*_submitted.pkl"))) == TASKS
    assert len(list((sweep_dir / "submitit").glob(f"{array_id}_*_0_result.pkl"))) == TASKS
    monkeypatch.setenv("SLURM_CONF", env["SLURM_CONF"])
    rows = sacct_rows(array_id, env, TASKS)
    assert sorted(r[0] for r in rows) == sorted(f"{array_id}_{i}" for i in range(TASKS))  # once each: no requeue
    assert {r[1] for r in rows} == {"COMPLETED"}

    status = json.loads(run_hpc("jobs", "status", array_id, "--json", env=env).stdout)
    assert (status["state"], status["tasks"]) == ("COMPLETED", {"COMPLETED": TASKS})
    one = json.loads(run_hpc("jobs", "status", f"{array_id}_57", "--json", env=env).stdout)
    assert one["state"] == "COMPLETED" and one["run_dir"] == str(sweep_dir / "task-057")
    listed = json.loads(run_hpc("jobs", "list", "--json", env=env).stdout)
    assert [(r["job_id"], r["state"], r["tasks"]) for r in listed] == [(array_id, "COMPLETED", {"COMPLETED": TASKS})]
    log = run_hpc("jobs", "logs", f"{array_id}_57", env=env)
    assert log.returncode == 0 and "probe rank 0" in log.stdout


def test_a_failing_task_shows_in_the_array_status_and_names_its_log(slurm_sandbox, tmp_path):
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    recipe = sweep_probe_recipe(tmp_path, PROBE_FAIL_ARG="boom")
    cluster = one_rank_cluster(slurm_sandbox, tmp_path)
    res = run_hpc("recipes", "submit", str(recipe), "--cluster", str(cluster), "--queue", "cpu",
                  "--sweep", "args.--text=ok,boom,fine", "--array-parallelism", "1", "--wait", "--json",
                  env=env, cwd=tmp_path, timeout=300)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    result = json.loads(res.stdout)
    array_id, sweep_dir = result["job_id"], Path(result["run_dir"])
    assert result["state"] == "FAILED"
    assert [(t["job_id"], t["state"]) for t in result["failed_tasks"]] == [(f"{array_id}_1", "FAILED")]
    assert f"task {array_id}_1 ended FAILED" in res.stderr
    assert "failing on purpose" in Path(result["failed_tasks"][0]["log"]).read_text()
    assert "--array=0-2%1" in (sweep_dir / "submitit" / f"{array_id}_submission.sh").read_text()

    status = run_hpc("jobs", "status", array_id, "--json", env=env)
    assert status.returncode == 1
    data = json.loads(status.stdout)
    assert (data["state"], data["tasks"]) == ("FAILED", {"COMPLETED": 2, "FAILED": 1})
    task = json.loads(run_hpc("jobs", "status", f"{array_id}_1", "--json", env=env).stdout)
    assert task["state"] == "FAILED" and task["run_dir"] == str(sweep_dir / "task-001")
    assert (sweep_dir / "task-001" / "failures" / "rank-0.json").is_file()
    assert not (sweep_dir / "task-001" / "result.json").exists()
