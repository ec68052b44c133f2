"""Run-dir summaries, scaling math and the figures."""

import contextlib
import json
from pathlib import Path

import pytest

from tests.test_training_logs import Attempt, write_trainer_log
from toolkit.errors import HpcError
from toolkit.reports.nccl import parse_file
from toolkit.reports.plots import nccl_figure, save_png, scaling_figure
from toolkit.reports.scaling import RunSummary, read_run, scaling
from toolkit.rundir import RunDir

FIXTURES = Path(__file__).parent / "fixtures"


def make_run(root: Path, name: str, nodes: int, ranks: int, rate: float, recipe: str = "resnet50",
             job_id: str = "123", **meta) -> Path:
    """A run dir as `hpc recipes submit` leaves it for the resnet50 smoke profile: metadata.json, result.json,
    the trainer's logs/train_log.jsonl (warm-up interval at 1/10 of `rate`, then `rate`) and, as on rank 0's
    stdout, its readable lines in submitit/<job>_0_log.out."""
    run = root / name
    (run / "submitit").mkdir(parents=True)
    (run / "metadata.json").write_text(json.dumps({
        "recipe": recipe, "profile": "smoke", "executor": "slurm", "queue": "cpu", "instance_type": "m5.xlarge",
        "nodes": nodes, "ranks_per_node": ranks // nodes, "ranks": ranks, "job_ids": [job_id], **meta}))
    with open(run / "submitit" / f"{job_id}_0_log.out", "w") as stdout, contextlib.redirect_stdout(stdout):
        write_trainer_log(run / "logs", [Attempt(0, [rate / 10, rate, rate, rate], status="max_steps")], ranks)
    (run / "submitit" / f"{job_id}_1_log.out").write_text("rank 1 logs nothing\n")
    (run / "result.json").write_text(json.dumps({"rank": 0, "host": "c1", "exit_code": 0, "ok": True}))
    return run


def test_read_run_uses_the_trainer_log_and_metadata(tmp_path):
    run = read_run(make_run(tmp_path, "r1", nodes=1, ranks=2, rate=100.0))
    assert (run.recipe, run.profile, run.nodes, run.ranks, run.job_ids) == ("resnet50", "smoke", 1, 2, ["123"])
    assert run.log.endswith("logs/train_log.jsonl") and run.result["exit_code"] == 0
    assert run.throughput == pytest.approx(100.0) and run.unit == "images/s" and run.training["updates"] == 8


def test_ranks_fall_back_to_nodes_times_ranks_per_node_then_world_size(tmp_path):
    a = make_run(tmp_path, "a", 2, 4, 50.0)
    meta = json.loads((a / "metadata.json").read_text())
    del meta["ranks"]
    (a / "metadata.json").write_text(json.dumps({**meta, "ranks_per_node": 3}))
    assert read_run(a).ranks == 6
    del meta["ranks_per_node"]
    (a / "metadata.json").write_text(json.dumps(meta))
    assert read_run(a).ranks == 4  # the trainer logged world_size 4


def test_log_preference_trainer_log_then_rank0_of_the_newest_job_then_the_rest(tmp_path):
    for name in ["logs/train_log.jsonl", "submitit/7_0_log.out", "submitit/12_0_log.err", "submitit/12_0_log.out",
                 "submitit/12_1_log.out", "resnet50-12.out", "metadata.json", "result.json"]:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("")
    assert [str(p.relative_to(tmp_path)) for p in RunDir(tmp_path).log_files()] == [
        "logs/train_log.jsonl", "submitit/12_0_log.out", "submitit/12_0_log.err", "submitit/7_0_log.out",
        "resnet50-12.out", "submitit/12_1_log.out"]


def test_fairseq_run_is_read_from_rank0_stdout(tmp_path):
    run = tmp_path / "roberta"
    (run / "submitit").mkdir(parents=True)
    (run / "metadata.json").write_text(json.dumps({"recipe": "roberta", "nodes": 2, "ranks_per_node": 2}))
    (run / "submitit" / "9_0_log.out").write_text(
        (FIXTURES / "training" / "fairseq_translation.sample.txt").read_text())
    (run / "submitit" / "9_1_log.out").write_text("")
    summary = read_run(run)
    assert summary.log.endswith("9_0_log.out") and summary.ranks == 4
    assert summary.unit == "words/s" and summary.training["updates"] == 6


def test_collectives_run_dir_is_summarised_as_nccl(tmp_path):
    run = tmp_path / "coll"
    run.mkdir()
    (run / "metadata.json").write_text(json.dumps({"recipe": "collectives", "nodes": 2, "ranks": 16}))
    (run / "job.out").write_text((FIXTURES / "nccl" / "2022_root_wrong_srun-label.sample.txt").read_text())
    summary = read_run(run)
    assert summary.training is None and summary.nccl[0]["test"] == "all_reduce"
    assert summary.nccl[0]["verdict"]["status"] == "NO-VERDICT"


@pytest.mark.parametrize("setup,message", [
    (lambda d: None, "no such run dir"),
    (lambda d: d.mkdir(), "has no metadata.json"),
    (lambda d: (d.mkdir(), (d / "metadata.json").write_text("[1]")), "not a JSON object"),
    (lambda d: (d.mkdir(), (d / "metadata.json").write_text('{"ranks": "two"}')), "positive integer"),
    (lambda d: (d.mkdir(), (d / "metadata.json").write_text('{"ranks": 2}')), "no training records"),
])
def test_run_dir_contract_errors(tmp_path, setup, message):
    run = tmp_path / "run"
    setup(run)
    with pytest.raises(HpcError) as err:
        read_run(run)
    assert message in err.value.message and err.value.fix


def _summary(ranks, throughput, recipe="resnet50", unit="images/s", profile=None):
    return RunSummary(f"run-{ranks}", recipe, ranks // 2 or 1, ranks, None, "log",
                      training={"throughput": throughput, "unit": unit}, profile=profile)


def test_scaling_math_against_the_smallest_run():
    rows = scaling([_summary(8, 280.0), _summary(2, 100.0), _summary(4, 180.0)])
    assert [r.ranks for r in rows] == [2, 4, 8]
    assert [r.speedup for r in rows] == pytest.approx([1.0, 1.8, 2.8])
    assert [r.ideal_throughput for r in rows] == pytest.approx([100.0, 200.0, 400.0])
    assert [r.efficiency for r in rows] == pytest.approx([1.0, 0.9, 0.7])


@pytest.mark.parametrize("runs,message", [
    ([], "no runs"),
    ([_summary(2, 10.0), _summary(4, 10.0, recipe="fairseq-wmt", unit="words/s")], "different recipes"),
    ([_summary(2, 10.0), _summary(4, 10.0, profile="smoke")], "different recipes"),
    ([_summary(2, 0.0), _summary(4, 10.0)], "zero throughput"),
    ([RunSummary("x", "r", 1, 2, None, "log", nccl=[])], "no training throughput"),
])
def test_scaling_rejects_what_cannot_be_compared(runs, message):
    with pytest.raises(HpcError) as err:
        scaling(runs)
    assert message in err.value.message


def test_scaling_figure_has_measured_and_ideal_series(tmp_path):
    rows = scaling([_summary(2, 100.0), _summary(4, 180.0)])
    fig = scaling_figure(rows, "images/s", "resnet50 scaling")
    [ax] = fig.axes
    assert ax.get_xlabel() == "ranks (GPUs or CPU processes)" and ax.get_ylabel() == "throughput (images/s)"
    measured, ideal = ax.get_lines()
    assert list(measured.get_xdata()) == [2, 4] and list(measured.get_ydata()) == [100.0, 180.0]
    assert list(ideal.get_ydata()) == [100.0, 200.0] and ax.get_ylim()[0] == 0
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["measured", "ideal (linear)"]
    png = save_png(fig, tmp_path / "scaling.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_nccl_figure_series_per_placement_and_floor(tmp_path):
    tests = parse_file(FIXTURES / "nccl" / "v2.17_timestamp-S.sample.txt")
    fig = nccl_figure(tests, floor_gbs=350.0)
    [ax] = fig.axes
    assert ax.get_xscale() == "log" and ax.get_ylabel() == "bus bandwidth (GB/s)"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["all_reduce out-of-place", "all_reduce in-place", "floor 350 GB/s"]
    assert list(ax.get_lines()[0].get_xdata()) == [r.size for r in tests[0].rows]
    with pytest.raises(HpcError):
        save_png(fig, tmp_path / "plot.jpg")
