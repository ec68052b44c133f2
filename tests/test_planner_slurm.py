"""`hpc plan calibrate` then `hpc plan` on the real local Slurm: the smoke ResNet calibrated at 1 and 2 nodes of the
`wide` partition (and a collectives run), recorded, and read back by a prediction that names no run dir."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import cli_json, run_hpc, slurm_env

pytestmark = [pytest.mark.slurm, pytest.mark.training]


def test_calibrate_at_1_and_2_nodes_then_predict_from_the_record(slurm_sandbox, tmp_path):
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    base = ["resnet50", "--profile", "smoke", "--queue", "wide"]
    res = run_hpc("plan", "calibrate", *base, "--nodes", "1,2", "--steps", "10", "--json", env=env, cwd=tmp_path,
                  timeout=600)
    assert res.returncode == 0, res.stderr
    calibration = cli_json(res)
    record = json.loads(Path(calibration["record"]).read_text())
    assert record["recipe"] == "resnet50" and record["queue"] == "wide" and record["profile"] == "smoke"
    assert [json.loads((Path(d) / "metadata.json").read_text())["nodes"] for d in record["training"]] == [1, 2]
    assert len(record["collectives"]) == 1
    res = run_hpc("plan", *base, "--nodes", "1,2,4,8", "--json", env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    plan = cli_json(res)
    assert sorted(plan["runs"]) == sorted([*record["training"], *record["collectives"]])
    assert [r["nodes"] for r in plan["rows"]] == [1, 2, 4, 8]
    assert all(r["throughput"] > 0 and r["time_s"] > 0 for r in plan["rows"])
    sources = {i["name"]: i["source"] for i in plan["inputs"]}
    assert record["collectives"][0] in sources["bus bandwidth (GB/s)"]
