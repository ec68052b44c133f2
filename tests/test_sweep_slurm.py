"""Sweeps on the real local Slurm: job arrays (split at the array limit), every task accounted for, failures
visible per task, one Slurm call per status poll."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from tests.conftest import cli_json, run_hpc, slurm_env
from tests.jobhelpers import one_rank_cluster, sweep_probe_recipe
from toolkit.slurm import commands

pytestmark = pytest.mark.slurm


def sacct_rows(array_id: str, env: dict, expected: int, timeout: float = 60) -> list[list[str]]:
    """Accounting's rows for the array, once it has recorded `expected` of them (it lags the controller)."""
    deadline = time.monotonic() + timeout
    while True:
        res = commands.run(["sacct", "-X", "-n", "-P", "-D", "-j", array_id, "-o", "JobID,State"], check=False)
        rows = [line.split("|") for line in res.stdout.splitlines() if line and "[" not in line]
        if len(rows) >= expected or time.monotonic() > deadline:
            return rows
        time.sleep(1)


def sweep_arrays(sweep_dir: Path) -> list[tuple[str, int, int]]:
    """(job id, first task, task count) of each array the sweep's metadata records."""
    meta = json.loads((sweep_dir / "metadata.json").read_text())
    return [(a["job_id"], a["first"], a["count"]) for a in meta["arrays"]]


def task_ids(arrays: list[tuple[str, int, int]]) -> list[str]:
    return [f"{job_id}_{n}" for job_id, _, count in arrays for n in range(count)]


def assert_every_task_ran_once(sweep_dir: Path, probe: Path, arrays, env: dict, monkeypatch) -> None:
    """One run dir per task, none lost or doubled, each recording its array, its own task and overrides; each
    task ran exactly once (its probe file, submitit's result, one accounting row), with its own value."""
    ids = task_ids(arrays)
    task_dirs = sorted(p.name for p in sweep_dir.iterdir() if p.name.startswith("task-"))
    assert task_dirs == [f"task-{i:03d}" for i in range(len(ids))]
    for i, job_id in enumerate(ids):
        meta = json.loads((sweep_dir / f"task-{i:03d}" / "metadata.json").read_text())
        assert (meta["task_index"], meta["array_job_id"], meta["job_ids"]) == (i, job_id.split("_")[0], [job_id])
        assert meta["sweep_overrides"] == [f"args.--count={i + 1}"]
        assert json.loads((sweep_dir / f"task-{i:03d}" / "result.json").read_text())["ok"] is True
    assert len(list(probe.glob("task-*-rank-*.json"))) == len(ids)
    for i, job_id in enumerate(ids):
        assert json.loads((probe / f"task-{job_id}-rank-0.json").read_text())["argv"] == ["--count", str(i + 1)]
    monkeypatch.setenv("SLURM_CONF", env["SLURM_CONF"])
    for array_id, _, count in arrays:
        assert len(list((sweep_dir / "submitit").glob(f"{array_id}_*_submitted.pkl"))) == count
        assert len(list((sweep_dir / "submitit").glob(f"{array_id}_*_0_result.pkl"))) == count
        assert f"--array=0-{count - 1}%" in (sweep_dir / "submitit" / f"{array_id}_submission.sh").read_text()
        rows = sacct_rows(array_id, env, count)
        assert sorted(r[0] for r in rows) == sorted(f"{array_id}_{n}" for n in range(count))  # once each: no requeue
        assert {r[1] for r in rows} == {"COMPLETED"}


def recording_slurm(tmp_path: Path, env: dict) -> tuple[dict, Path]:
    """The Slurm query commands behind recording wrappers (first on PATH): each call is appended to the file
    $SLURM_CALL_LOG names, then the real command runs."""
    wrappers = tmp_path / "recording-bin"
    wrappers.mkdir()
    for program in ("sacct", "squeue", "scontrol"):
        real = shutil.which(program, path=env.get("PATH"))
        assert real, program
        (wrappers / program).write_text(f'#!/bin/sh\necho "{program} $*" >> "$SLURM_CALL_LOG"\nexec {real} "$@"\n')
        (wrappers / program).chmod(0o755)
    log = tmp_path / "slurm-calls.log"
    return dict(env, PATH=f"{wrappers}{os.pathsep}{env.get('PATH', '')}", SLURM_CALL_LOG=str(log)), log


def test_a_sweep_over_the_array_limit_is_arrays_with_every_task_once_and_one_slurm_call_per_poll(
        slurm_sandbox, tmp_path, monkeypatch):
    """HPC_MAX_ARRAY_SIZE=2: 6 tasks are 3 arrays of 2 tasks; --wait and `hpc jobs status` poll all three with
    one call each. (Splitting at a cluster's MaxArraySize, large counts included: tests/test_sweep.py.)"""
    tasks = 6
    env, calls = recording_slurm(tmp_path, dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"),
                                                HPC_MAX_ARRAY_SIZE="2"))
    recipe, cluster = sweep_probe_recipe(tmp_path), one_rank_cluster(slurm_sandbox, tmp_path)
    dry = run_hpc("recipes", "submit", str(recipe), "--cluster", str(cluster), "--queue", "cpu",
                  "--sweep", f"args.--count=1..{tasks}", "--dry-run", env=env, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert f"{tasks} points as 3 job arrays (tasks 0-1, 2-3, 4-5), at most 2 tasks per array: $HPC_MAX_ARRAY_SIZE" \
        in dry.stdout
    res = run_hpc("recipes", "submit", str(recipe), "--cluster", str(cluster), "--queue", "cpu",
                  "--sweep", f"args.--count=1..{tasks}", "--wait", "--json", env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    result = cli_json(res)
    sweep_dir = Path(result["run_dir"])
    arrays = sweep_arrays(sweep_dir)
    assert [(first, count) for _, first, count in arrays] == [(0, 2), (2, 2), (4, 2)]
    assert result["state"] == "COMPLETED" and result["tasks"] == tasks and result["job_id"] == arrays[0][0]
    assert result["arrays"] == [{"job_id": a, "first": f, "count": c} for a, f, c in arrays]
    all_arrays = ",".join(a for a, _, _ in arrays)
    # --wait's polls: every Slurm query after the submission is one sacct for all three arrays.
    polls = calls.read_text().splitlines()
    polls = polls[max(i for i, line in enumerate(polls) if line.startswith("scontrol ping")) + 1:]
    assert polls and all(line.startswith("sacct ") and f"-j {all_arrays} " in line for line in polls), polls
    assert_every_task_ran_once(sweep_dir, tmp_path / "probe", arrays, env, monkeypatch)

    # One summary of the whole sweep, by any array's id or the sweep's name; each poll one Slurm call.
    for sweep_id in [a for a, _, _ in arrays] + [sweep_dir.name]:
        calls.unlink()
        status = cli_json(run_hpc("jobs", "status", sweep_id, "--json", env=env))
        assert (status["job_id"], status["state"], status["tasks"]) == (arrays[0][0], "COMPLETED",
                                                                        {"COMPLETED": tasks})
        assert calls.read_text().splitlines() == [f"sacct -X -n -P -D -j {all_arrays} -o "
                                                  "JobID,State,ExitCode,Elapsed,NodeList,Reason"]
    calls.unlink()
    last = cli_json(run_hpc("jobs", "status", f"{arrays[2][0]}_1", "--json", env=env))
    assert (last["state"], last["run_dir"]) == ("COMPLETED", str(sweep_dir / "task-005"))
    assert len(calls.read_text().splitlines()) == 1
    listed = cli_json(run_hpc("jobs", "list", "--json", env=env))
    assert [(r["job_id"], r["state"], r["tasks"]) for r in listed] == [(arrays[0][0], "COMPLETED",
                                                                        {"COMPLETED": tasks})]
    log = run_hpc("jobs", "logs", f"{arrays[1][0]}_1", env=env)
    assert log.returncode == 0 and "probe rank 0" in log.stdout


def test_a_failing_task_shows_in_the_array_status_and_names_its_log(slurm_sandbox, tmp_path):
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    recipe = sweep_probe_recipe(tmp_path, PROBE_FAIL_ARG="boom")
    cluster = one_rank_cluster(slurm_sandbox, tmp_path)
    res = run_hpc("recipes", "submit", str(recipe), "--cluster", str(cluster), "--queue", "cpu",
                  "--sweep", "args.--text=ok,boom,fine", "--array-parallelism", "1", "--wait", "--json",
                  env=env, cwd=tmp_path, timeout=300)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    result = cli_json(res)
    array_id, sweep_dir = result["job_id"], Path(result["run_dir"])
    assert result["state"] == "FAILED"
    assert [(t["job_id"], t["state"]) for t in result["failed_tasks"]] == [(f"{array_id}_1", "FAILED")]
    assert f"task {array_id}_1 ended FAILED" in res.stderr
    assert "failing on purpose" in Path(result["failed_tasks"][0]["log"]).read_text()
    assert "--array=0-2%1" in (sweep_dir / "submitit" / f"{array_id}_submission.sh").read_text()

    status = run_hpc("jobs", "status", array_id, "--json", env=env)
    assert status.returncode == 1
    data = cli_json(status)
    assert (data["state"], data["tasks"]) == ("FAILED", {"COMPLETED": 2, "FAILED": 1})
    task = cli_json(run_hpc("jobs", "status", f"{array_id}_1", "--json", env=env))
    assert task["state"] == "FAILED" and task["run_dir"] == str(sweep_dir / "task-001")
    assert (sweep_dir / "task-001" / "failures" / "rank-0.json").is_file()
    assert not (sweep_dir / "task-001" / "result.json").exists()


@pytest.mark.training
def test_two_fairseq_points_train_into_two_checkpoint_dirs(slurm_sandbox, tmp_path):
    """Issue 18: with the checkpoint dir under the dirs root (as roberta's own recipe has it), every point shared
    one and fairseq resumed each point from another's checkpoint_last.pt. Now each task's run dir holds its own
    checkpoints, trained with its own value: 2 points of roberta's smoke profile, 1 rank each, 2 updates."""
    import torch

    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    res = run_hpc("recipes", "submit", "roberta", "--profile", "smoke", "--nodes", "1",
                  "--cluster", str(one_rank_cluster(slurm_sandbox, tmp_path)), "--queue", "cpu",
                  "--set", "dirs.checkpoints.under=root", "--set", "args.--max-update=2",
                  "--set", "args.--total-num-update=2", "--set", "args.--warmup-updates=1",
                  "--sweep", "args.--weight-decay=0.0,0.01", "--wait", "--json", env=env, cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr
    sweep_dir = Path(cli_json(res)["run_dir"])
    for index, decay in enumerate((0.0, 0.01)):
        state = torch.load(sweep_dir / f"task-{index:03d}" / "checkpoints" / "checkpoint_last.pt",
                           map_location="cpu", weights_only=False)
        assert state["cfg"]["optimizer"]["weight_decay"] == decay
        assert state["optimizer_history"][-1]["num_updates"] == 2
    assert not (tmp_path / "smoke" / "checkpoints").exists()  # the shared dir the recipe names is not used
