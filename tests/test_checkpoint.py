"""Checkpoints are written atomically: readers and restarts see a whole old file or a whole new one."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import REPO
from toolkit.workloads import checkpoint

pytestmark = pytest.mark.training


def _state(value: int) -> dict:
    import torch  # here, not at the top: collecting this module must not need the training environment

    return {"step": value, "weights": torch.full((1_000_000,), float(value))}  # 4 MB: a write takes a while


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def test_a_failed_save_leaves_the_previous_checkpoint_and_no_partial_file(tmp_path):
    import torch

    path = tmp_path / checkpoint.LAST
    checkpoint.save_atomic(_state(1), path)
    with pytest.raises(RuntimeError, match="cannot pickle"):
        checkpoint.save_atomic({"weights": torch.zeros(1_000_000), "bad": Unpicklable()}, path)
    assert checkpoint.load(path)["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint.LAST]


WRITER = textwrap.dedent("""
    import sys, torch
    from toolkit.workloads import checkpoint
    step = 0
    while True:
        step += 1
        checkpoint.save_atomic({"step": step, "weights": torch.full((1_000_000,), float(step))}, sys.argv[1])
""")


def test_readers_never_see_a_partial_file_even_when_the_writer_is_killed(tmp_path):
    path = tmp_path / checkpoint.LAST
    checkpoint.save_atomic(_state(0), path)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], cwd=REPO)
    try:
        seen = set()
        deadline = time.monotonic() + 60
        while len(seen) < 5 and time.monotonic() < deadline:
            state = checkpoint.load(path)  # would raise on a truncated file
            assert bool((state["weights"] == state["step"]).all())
            seen.add(state["step"])
        assert len(seen) >= 5, "the writer made too little progress to test anything"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
    state = checkpoint.load(path)
    assert bool((state["weights"] == state["step"]).all()) and state["step"] >= max(seen)
    checkpoint.remove_partial_saves(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint.LAST]


def test_last_checkpoint_is_found_only_when_present(tmp_path):
    assert checkpoint.last_checkpoint(None) is None
    assert checkpoint.last_checkpoint(tmp_path) is None
    checkpoint.save_atomic(_state(2), tmp_path / checkpoint.LAST)
    assert checkpoint.last_checkpoint(tmp_path) == tmp_path / checkpoint.LAST
