"""Our ResNet trainer for real, on CPU: it learns, runs as 2 gloo ranks, resumes exactly, stops on a signal.

Each rank runs `python -m toolkit.workloads.resnet` in its own process with one thread (oversubscribing the
two cores costs 2-3x), on 80 digit images, so a run takes a few seconds.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, free_port
from toolkit.workloads import checkpoint, smoke_data
from toolkit.workloads.stopping import EXIT_STOPPED
from toolkit.workloads.train_log import LOG_NAME, read_log

pytestmark = pytest.mark.training

TRAIN_PER_CLASS, VAL_PER_CLASS = 8, 3
# 80 training images: 10 steps an epoch on 2 ranks x 4 images.
BASE_ARGS = ["--arch", "resnet18", "--batch-size", "4", "--lr", "0.02", "--warmup-epochs", "0.2",
             "--nesterov", "--zero-init-last-bn", "--image-size", "32", "--crop-scale-min", "0.5",
             "--threads", "1", "--log-every-steps", "1", "--seed", "5"]


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """A small ImageFolder cut from the images smoke data set."""
    full, _ = smoke_data.ensure("images", tmp_path_factory.mktemp("smoke") / "images")
    small = tmp_path_factory.mktemp("digits")
    for split, per_class in (("train", TRAIN_PER_CLASS), ("val", VAL_PER_CLASS)):
        for class_dir in sorted((full / split).iterdir()):
            (small / split / class_dir.name).mkdir(parents=True)
            for image in sorted(class_dir.iterdir())[:per_class]:
                shutil.copy(image, small / split / class_dir.name / image.name)
    return small


def start_ranks(args: list[str], world_size: int, out_dir: Path) -> list[subprocess.Popen]:
    """One trainer process per rank, wired up the way a launcher does it (torchrun-style variables)."""
    port = free_port()
    out_dir.mkdir(parents=True, exist_ok=True)
    ranks = []
    for rank in range(world_size):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(REPO)}
        with open(out_dir / f"rank{rank}.out", "w") as output:
            ranks.append(subprocess.Popen([sys.executable, "-m", "toolkit.workloads.resnet", *args], env=env,
                                          stdout=output, stderr=subprocess.STDOUT, cwd=REPO))
    return ranks


def wait_ranks(ranks: list[subprocess.Popen], timeout: float = 180) -> list[int]:
    try:
        return [rank.wait(timeout=timeout) for rank in ranks]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()


def run_ranks(args: list[str], world_size: int, out_dir: Path) -> list[int]:
    return wait_ranks(start_ranks(args, world_size, out_dir))


def run_args(data: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["--data", str(data), "--log-dir", str(run_dir), "--checkpoint-dir", str(run_dir / "ckpt"),
            *BASE_ARGS, *extra]


def losses(run_dir: Path) -> dict[int, float]:
    """Loss by step; after a resume the last record of a step counts."""
    return {r["step"]: r["loss"] for r in read_log(run_dir / LOG_NAME) if r["event"] == "train"}


def outputs(run_dir: Path, world_size: int) -> list[str]:
    return [(run_dir / f"rank{rank}.out").read_text() for rank in range(world_size)]


@pytest.fixture(scope="module")
def reference(digits, tmp_path_factory) -> Path:
    """An uninterrupted 2-rank run: 2 epochs of 10 steps, loading in the rank itself. The interrupted runs
    load in a worker process: the losses must not depend on that either."""
    run_dir = tmp_path_factory.mktemp("reference")
    codes = run_ranks(run_args(digits, run_dir, "--epochs", "2", "--workers", "0"), 2, run_dir)
    assert codes == [0, 0], outputs(run_dir, 2)
    return run_dir


def test_single_rank_learns(digits, tmp_path):
    codes = run_ranks(run_args(digits, tmp_path, "--epochs", "2", "--batch-size", "8", "--crop-scale-min", "1.0",
                               "--workers", "0", "--log-every-steps", "5"), 1, tmp_path)
    assert codes == [0], outputs(tmp_path, 1)
    records = read_log(tmp_path / LOG_NAME)
    train = [r for r in records if r["event"] == "train"]
    assert [r["step"] for r in train] == [5, 10, 15, 20]
    assert all(r["world_size"] == 1 and r["images_per_sec"] > 0 for r in train)
    assert train[-1]["loss"] < train[0]["loss"] - 0.3, [r["loss"] for r in train]
    assert [r["epoch"] for r in records if r["event"] == "val"] == [0, 1]
    assert records[-1]["event"] == "end" and records[-1]["status"] == "completed" and records[-1]["step"] == 20
    assert records[-1]["steady_images_per_sec"] > 0
    assert checkpoint.load(tmp_path / "ckpt" / checkpoint.LAST)["epoch"] == 2


def test_two_gloo_ranks_form_one_group(reference):
    for rank, text in enumerate(outputs(reference, 2)):
        assert f"rank {rank} local_rank {rank} world_size 2 backend gloo device cpu threads 1" in text
    records = read_log(reference / LOG_NAME)
    assert records[0]["event"] == "start" and records[0]["world_size"] == 2 and records[0]["steps_per_epoch"] == 10
    assert sorted(losses(reference)) == list(range(1, 21))
    assert all(r["world_size"] == 2 for r in records if r["event"] == "train")
    assert records[-1]["status"] == "completed" and records[-1]["step"] == 20
    rank0, rank1 = outputs(reference, 2)
    assert "step 1 epoch 0 loss" in rank0 and "step 1 epoch 0 loss" not in rank1  # only rank 0 logs


def test_resume_after_max_steps_repeats_the_uninterrupted_losses(digits, reference, tmp_path):
    args = run_args(digits, tmp_path, "--epochs", "2", "--workers", "1", "--checkpoint-every-steps", "4")
    assert run_ranks([*args, "--max-steps", "13"], 2, tmp_path / "first") == [0, 0]
    assert checkpoint.load(tmp_path / "ckpt" / checkpoint.LAST)["step"] == 13  # mid-epoch 1, after epoch 0's end
    assert run_ranks(args, 2, tmp_path / "second") == [0, 0]
    assert losses(tmp_path) == losses(reference)
    starts = [r for r in read_log(tmp_path / LOG_NAME) if r["event"] == "start"]
    assert [s["resumed_from_step"] for s in starts] == [0, 13]
    val = [(r["epoch"], r["top1"]) for r in read_log(tmp_path / LOG_NAME) if r["event"] == "val"]
    assert val == [(r["epoch"], r["top1"]) for r in read_log(reference / LOG_NAME) if r["event"] == "val"]
    # The checkpoint now belongs to this run: resuming it with another batch size is refused, clearly.
    assert run_ranks([*args, "--batch-size", "5"], 1, tmp_path / "third") == [1]
    text = outputs(tmp_path / "third", 1)[0]
    assert "error:" in text and "world_size 2 -> 1, batch_size 4 -> 5" in text and "fix:" in text
    assert "Traceback" not in text


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as handle:
        return [int(child) for child in handle.read().split()]


def test_a_signal_to_one_rank_stops_all_at_the_same_step_and_resumes_exactly(digits, reference, tmp_path):
    args = run_args(digits, tmp_path, "--epochs", "2", "--workers", "1", "--checkpoint-every-steps", "4")
    ranks = start_ranks(args, 2, tmp_path / "first")
    deadline = time.monotonic() + 120
    while not any(step >= 3 for step in (losses(tmp_path) if (tmp_path / LOG_NAME).exists() else {})):
        assert time.monotonic() < deadline and all(rank.poll() is None for rank in ranks), "no step 3 came"
        time.sleep(0.05)
    # Like Slurm's signal to a job step: rank 1 and its loader worker get it; rank 0 does not.
    for pid in [ranks[1].pid, *_children(ranks[1].pid)]:
        os.kill(pid, signal.SIGUSR2)
    assert wait_ranks(ranks) == [EXIT_STOPPED, EXIT_STOPPED], outputs(tmp_path / "first", 2)
    end = read_log(tmp_path / LOG_NAME)[-1]
    assert end["event"] == "end" and end["status"] == "stopped" and 3 <= end["step"] < 20
    assert checkpoint.load(tmp_path / "ckpt" / checkpoint.LAST)["step"] == end["step"]
    rank0, rank1 = outputs(tmp_path / "first", 2)
    assert f"rank 1 got SIGUSR2: stopped after step {end['step']}" in rank1
    assert f"rank 0 was asked by another rank: stopped after step {end['step']}" in rank0
    assert run_ranks(args, 2, tmp_path / "second") == [0, 0]
    assert losses(tmp_path) == losses(reference)


def test_a_missing_data_dir_is_a_clear_error(tmp_path):
    codes = run_ranks(["--data", str(tmp_path / "nowhere"), *BASE_ARGS, "--epochs", "1"], 1, tmp_path)
    text = outputs(tmp_path, 1)[0]
    assert codes == [1] and "error: no train/ directory" in text and "fix:" in text and "Traceback" not in text
