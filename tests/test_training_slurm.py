"""Every training recipe end to end on the real local Slurm: 2 nodes x 2 ranks, smoke profile, one process group;
then `hpc report run|scaling` on the run dirs those runs made.

Asserted from the logs: world size 4, the set number of updates reached, a finite loss that falls; then
`hpc jobs status` says COMPLETED. The smoke profiles make their own data (no download). Each recipe runs once
for the module: the report tests read the same runs (resnet50 also at 1 node, for the scaling table).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from tests.conftest import CLEAN_RUN_LINE, cli_json, run_hpc, slurm_env, submit_json
from toolkit.reports.training_logs import parse_training_file
from toolkit.workloads.train_log import read_log

pytestmark = [pytest.mark.slurm, pytest.mark.training]


@pytest.fixture(scope="module")
def smoke(slurm_sandbox, tmp_path_factory):
    """smoke(recipe, nodes=2, *options): the recipe's smoke profile submitted once for the module, COMPLETED."""
    tmp = tmp_path_factory.mktemp("smoke")
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp / "runs"))
    done: dict[tuple[str, int], dict] = {}

    def run(recipe: str, nodes: int = 2, *options: str) -> dict:
        if (recipe, nodes) not in done:
            # submitit's side (--executor slurm): fairseq's log is rank 0's own file there
            result = submit_json(recipe, "--profile", "smoke", "--nodes", str(nodes), "--executor", "slurm", *options,
                                 "--wait", env=env, cwd=tmp)
            assert result["state"] == "COMPLETED" and result["ranks"] == 2 * nodes
            status = run_hpc("jobs", "status", result["job_id"], "--json", env=env)
            assert status.returncode == 0 and cli_json(status)["state"] == "COMPLETED"
            done[recipe, nodes] = result
        return done[recipe, nodes]
    run.env, run.cwd = env, tmp
    return run


def falls(losses: list[float]) -> bool:
    return all(math.isfinite(x) for x in losses) and sum(losses[-2:]) / 2 < sum(losses[:2]) / 2


# Our part (the fairseq launcher, its rendezvous and flags on 2 nodes x 2 ranks) is the same for both recipes;
# roberta's masked-LM task training is fairseq's own (a canary; roberta also trains, requeued, in test_requeue_slurm).
@pytest.mark.parametrize("recipe", ["transformer", pytest.param("roberta", marks=pytest.mark.canary)])
def test_fairseq_recipe_trains_on_four_ranks(smoke, recipe):
    result = smoke(recipe)
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


def test_resnet_trains_on_four_ranks(smoke):
    result = smoke("resnet50")
    records = read_log(Path(result["run_dir"]) / "logs" / "train_log.jsonl")
    start = next(r for r in records if r["event"] == "start")
    assert (start["world_size"], start["backend"], start["threads"]) == (4, "gloo", 1)
    train = [r for r in records if r["event"] == "train"]
    end = records[-1]
    assert end["event"] == "end" and end["status"] == "completed" and end["step"] == start["total_steps"]
    assert falls([r["loss"] for r in train])
    assert (Path(result["run_dir"]) / "checkpoints" / "checkpoint_last.pt").is_file()
    # The ranks' heartbeats timed every step's phases, and no rank of this clean run straggles (no false alarm;
    # a node made slow: tests/test_stragglers_slurm.py), judged at the line this shared bench allows (CLEAN_RUN_LINE).
    report = run_hpc("report", "run", result["run_dir"], "--json", *CLEAN_RUN_LINE, env=smoke.env)
    assert report.returncode == 0, report.stdout + report.stderr
    stragglers = cli_json(report)["stragglers"]
    assert [(r["rank"], r["steps"]) for r in stragglers["ranks"]] == [(rank, end["step"] - 1) for rank in range(4)]
    assert stragglers["note"] is None  # judged: enough steps
    assert stragglers["lines"] == [] and all(set(r["phases_ms"]) == {"data", "compute", "sync"}
                                             for r in stragglers["ranks"])


def test_resnet50_at_one_and_two_nodes_gives_a_scaling_table_json_and_png(smoke):
    # The 1-node run stops at step 12 (its epoch has twice the 2-node run's steps): 6 logged intervals, a steady rate.
    runs = [Path(smoke("resnet50", 1, "--set", "args.--max-steps=12")["run_dir"]), Path(smoke("resnet50")["run_dir"])]
    env, cwd = smoke.env, smoke.cwd
    png = cwd / "out.png"
    res = run_hpc("report", "scaling", *map(str, runs), "--json", "--plot", str(png), env=env, cwd=cwd)
    assert res.returncode == 0, res.stderr
    data = cli_json(res)
    assert (data["recipe"], data["unit"], data["baseline"]) == ("resnet50", "images/s", str(runs[0]))
    rows = data["runs"]
    assert [(r["run_dir"], r["nodes"], r["ranks"]) for r in rows] == [(str(runs[0]), 1, 2), (str(runs[1]), 2, 4)]
    for run, row in zip(runs, rows, strict=True):
        # the report's throughput is the trainer's own (one start: its `end` record says it too)
        [end] = [r for r in read_log(run / "logs" / "train_log.jsonl") if r["event"] == "end"]
        assert row["throughput"] > 0 and row["throughput"] == pytest.approx(end["steady_images_per_sec"])
    base = rows[0]["throughput"]
    assert [r["speedup"] for r in rows] == pytest.approx([1.0, rows[1]["throughput"] / base])
    assert [r["ideal_throughput"] for r in rows] == pytest.approx([base, 2 * base])
    assert [r["efficiency"] for r in rows] == pytest.approx([1.0, rows[1]["throughput"] / (2 * base)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "plot: " in res.stderr

    table = run_hpc("report", "scaling", *map(str, runs), env=env, cwd=cwd)
    assert table.returncode == 0, table.stderr
    assert "efficiency" in table.stdout and f"{rows[1]['efficiency']:.0%}" in table.stdout

    res = run_hpc("report", "run", str(runs[1]), *CLEAN_RUN_LINE, env=env, cwd=cwd)
    assert res.returncode == 0, res.stderr
    steps = next(r for r in read_log(runs[1] / "logs" / "train_log.jsonl") if r["event"] == "start")["total_steps"]
    assert "recipe resnet50 (profile smoke), nodes 2, ranks 4" in res.stdout
    assert "images/s (first interval after each of 1 start(s) excluded" in res.stdout
    assert f"updates: {steps}" in res.stdout and "trainer: completed after 1 start(s)" in res.stdout
    assert "rank 0 exit code 0" in res.stdout


def test_a_fairseq_run_is_read_from_rank0_stdout(smoke):
    run = Path(smoke("transformer")["run_dir"])
    res = run_hpc("report", "run", str(run), "--json", env=smoke.env, cwd=smoke.cwd)
    assert res.returncode == 0, res.stderr
    summary = cli_json(res)
    training = summary["training"]
    assert summary["ranks"] == 4 and summary["log"] == str(run / "submitit" / f"{summary['job_ids'][0]}_0_log.out")
    assert (training["format"], training["unit"], training["loss_base"]) == ("fairseq", "words/s", "2")
    assert training["updates"] == 20 and training["throughput"] > 0
    losses = [loss for _, loss in training["loss_curve"]]
    assert len(losses) == 10 and losses[-1] < losses[0]
    assert training["valid_curve"] and all(top1 is None for _, _, top1 in training["valid_curve"])

    text = run_hpc("report", "run", str(run), env=smoke.env, cwd=smoke.cwd)
    assert text.returncode == 0, text.stderr
    assert " words/s (" in text.stdout and "updates: 20" in text.stdout and "(base 2)" in text.stdout


# Both recipes go through our fairseq launcher and --save-dir; roberta's (the issue's own example) is a canary.
@pytest.mark.parametrize("recipe", ["transformer", pytest.param("roberta", marks=pytest.mark.canary)])
def test_a_second_run_with_other_values_starts_from_scratch_in_its_own_checkpoint_dir(smoke, recipe):
    """A run owns its checkpoints (issue 31): a second submission of the recipe with another learning rate trains
    from update 1 and saves its own values beside the module's first run (20 updates). With one shared --save-dir,
    fairseq restored the first run's checkpoint_last.pt in the second, which continued it with the first's values."""
    import torch

    first = smoke(recipe)
    second = submit_json(recipe, "--profile", "smoke", "--nodes", "1", "--set", "args.--lr=0.000123",
                         "--set", "args.--max-update=2", "--wait", env=smoke.env, cwd=smoke.cwd)
    assert second["state"] == "COMPLETED"
    found = {}
    for name, result in (("first", first), ("second", second)):
        checkpoint = next(Path(result["run_dir"]).glob("checkpoints/**/checkpoint_last.pt"))
        found[name] = (checkpoint.parent, torch.load(checkpoint, map_location="cpu", weights_only=False))
    assert found["first"][0] != found["second"][0]
    state = found["second"][1]
    assert list(state["cfg"]["optimization"]["lr"]) == [0.000123]
    assert state["optimizer_history"][-1]["num_updates"] == 2  # its own two updates, not the first run's 20
    assert found["first"][1]["optimizer_history"][-1]["num_updates"] == 20  # and the first run's are untouched
