"""`hpc report run|scaling` on run dirs made by `hpc recipes submit` on the real local Slurm.

resnet50 smoke at 1 node (2 ranks) and 2 nodes (4 ranks), capped at 12 steps, then `hpc report scaling`
(table, JSON, PNG) and `hpc report run`; roberta smoke on 2 nodes (fairseq on rank 0's stdout) read by
`hpc report run`. Other jobs may share the cluster: generous timeouts, no assertions about the queue.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_hpc, slurm_env, submit_json
from toolkit.workloads.train_log import read_log

pytestmark = [pytest.mark.slurm, pytest.mark.training]
PATIENCE_S = 900  # a job may pend behind other helpers' jobs


def submit(recipe: str, nodes: int, env: dict, cwd: Path, *overrides: str) -> Path:
    sets = [arg for value in overrides for arg in ("--set", value)]
    outcome = submit_json(recipe, "--profile", "smoke", "--nodes", str(nodes), *sets, "--wait", env=env, cwd=cwd,
                          timeout=PATIENCE_S)
    assert outcome["state"] == "COMPLETED"
    return Path(outcome["run_dir"])


def test_resnet50_smoke_at_one_and_two_nodes_gives_a_scaling_table_json_and_png(slurm_sandbox, tmp_path):
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    runs = [submit("resnet50", nodes, env, tmp_path, "args.--max-steps=12") for nodes in (1, 2)]

    png = tmp_path / "out.png"
    res = run_hpc("report", "scaling", *map(str, runs), "--json", "--plot", str(png), env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert (data["recipe"], data["unit"], data["baseline"]) == ("resnet50", "images/s", str(runs[0]))
    rows = data["runs"]
    assert [(r["run_dir"], r["nodes"], r["ranks"]) for r in rows] == [(str(runs[0]), 1, 2), (str(runs[1]), 2, 4)]
    for run, row in zip(runs, rows):
        # the report's throughput is the trainer's own (one start: its `end` record says it too)
        [end] = [r for r in read_log(run / "logs" / "train_log.jsonl") if r["event"] == "end"]
        assert row["throughput"] > 0 and row["throughput"] == pytest.approx(end["steady_images_per_sec"])
    base = rows[0]["throughput"]
    assert [r["speedup"] for r in rows] == pytest.approx([1.0, rows[1]["throughput"] / base])
    assert [r["ideal_throughput"] for r in rows] == pytest.approx([base, 2 * base])
    assert [r["efficiency"] for r in rows] == pytest.approx([1.0, rows[1]["throughput"] / (2 * base)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "plot: " in res.stderr

    table = run_hpc("report", "scaling", *map(str, runs), env=env, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert "efficiency" in table.stdout and f"{rows[1]['efficiency']:.0%}" in table.stdout

    res = run_hpc("report", "run", str(runs[1]), env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "recipe resnet50 (profile smoke), nodes 2, ranks 4" in res.stdout
    assert "images/s (first interval after each of 1 start(s) excluded" in res.stdout
    assert "updates: 12" in res.stdout and "trainer: max_steps after 1 start(s)" in res.stdout
    assert "rank 0 exit code 0" in res.stdout


def test_roberta_smoke_on_two_nodes_read_from_rank0_stdout(slurm_sandbox, tmp_path):
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    run = submit("roberta", 2, env, tmp_path)

    res = run_hpc("report", "run", str(run), "--json", env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    training = summary["training"]
    assert summary["ranks"] == 4 and summary["log"] == str(run / "submitit" / f"{summary['job_ids'][0]}_0_log.out")
    assert (training["format"], training["unit"], training["loss_base"]) == ("fairseq", "words/s", "2")
    assert training["updates"] == 20 and training["throughput"] > 0
    losses = [loss for _, loss in training["loss_curve"]]
    assert len(losses) == 10 and losses[-1] < losses[0]
    assert training["valid_curve"] and all(top1 is None for _, _, top1 in training["valid_curve"])

    text = run_hpc("report", "run", str(run), env=env, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert " words/s (" in text.stdout and "updates: 20" in text.stdout and "(base 2)" in text.stdout
