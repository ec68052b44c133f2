"""Every training recipe end to end on the real local Slurm: 2 nodes x 2 ranks, smoke profile, one process group.

Asserted from the logs: world size 4, the set number of updates reached, a finite loss that falls; then
`hpc jobs status` says COMPLETED. The smoke profiles make their own data (no download).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from tests.conftest import run_hpc, slurm_env, submit_json
from toolkit.reports.training_logs import parse_training_file
from toolkit.workloads.train_log import read_log

pytestmark = [pytest.mark.slurm, pytest.mark.training]


def submit_smoke(sandbox, tmp_path: Path, recipe: str) -> tuple[dict, dict]:
    env = dict(slurm_env(sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    result = submit_json(recipe, "--profile", "smoke", "--nodes", "2", "--wait", env=env, cwd=tmp_path)
    assert result["state"] == "COMPLETED" and result["ranks"] == 4
    status = run_hpc("jobs", "status", result["job_id"], "--json", env=env)
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "COMPLETED"
    return result, env


def falls(losses: list[float]) -> bool:
    return all(math.isfinite(x) for x in losses) and sum(losses[-2:]) / 2 < sum(losses[:2]) / 2


@pytest.mark.parametrize("recipe", ["transformer", "roberta"])
def test_fairseq_recipe_trains_on_four_ranks(slurm_sandbox, tmp_path, recipe):
    result, _env = submit_smoke(slurm_sandbox, tmp_path, recipe)
    logs = Path(result["run_dir"]) / "submitit"
    job = result["job_id"]
    rank0 = (logs / f"{job}_0_log.err").read_text() + (logs / f"{job}_0_log.out").read_text()
    assert "training on 4 devices" in rank0
    for rank in range(4):  # every rank joined the same rendezvous
        text = (logs / f"{job}_{rank}_log.err").read_text() + (logs / f"{job}_{rank}_log.out").read_text()
        assert re.search(rf"distributed init \(rank {rank}\): tcp://c1:\d+", text), f"rank {rank}"
    log = parse_training_file(logs / f"{job}_0_log.out")  # fairseq logs to stdout; only rank 0 logs training
    inner = [p for p in log.points if p.kind == "train_inner"]
    assert max(p.update for p in inner) == 20
    assert falls([p.loss for p in inner])


def test_resnet_trains_on_four_ranks(slurm_sandbox, tmp_path):
    result, _env = submit_smoke(slurm_sandbox, tmp_path, "resnet50")
    records = read_log(Path(result["run_dir"]) / "logs" / "train_log.jsonl")
    start = next(r for r in records if r["event"] == "start")
    assert (start["world_size"], start["backend"], start["threads"]) == (4, "gloo", 1)
    train = [r for r in records if r["event"] == "train"]
    end = records[-1]
    assert end["event"] == "end" and end["status"] == "completed" and end["step"] == start["total_steps"]
    assert falls([r["loss"] for r in train])
    assert (Path(result["run_dir"]) / "checkpoints" / "checkpoint_last.pt").is_file()


def test_a_bad_data_path_fails_the_wait_and_names_the_failing_ranks_log(slurm_sandbox, tmp_path):
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    res = run_hpc("recipes", "submit", "resnet50", "--profile", "smoke", "--nodes", "2", "--wait",
                  "--set", f"dirs.data.dir={tmp_path / 'no-such-data'}", "--set", "prepare=[]",
                  env=env, cwd=tmp_path, timeout=600)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    log = re.search(r"ended FAILED.*\(see (\S+_log\.err)\)", res.stderr)
    assert log, res.stderr
    assert "no-such-data" in Path(log.group(1)).read_text()
