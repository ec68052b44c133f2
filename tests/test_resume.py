"""A requeued fairseq job resumes from a whole checkpoint_last.pt: the set-up lines of toolkit.job.resume, run by bash
on checkpoints torch really wrote, the way fairseq 0.12 leaves them when a job is stopped during its copy."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from toolkit.job.resume import checkpoint_repair_lines

torch = pytest.importorskip("torch")


def save(path: Path, step: int, mtime: float) -> None:
    torch.save({"step": step, "weights": torch.arange(1000) * step}, path)
    os.utime(path, (mtime, mtime))


def set_up(checkpoint_dir: Path) -> str:
    """The lines as the job's batch shell runs them (with the script's own strict mode); its output."""
    script = "\n".join(["set -euo pipefail", *checkpoint_repair_lines("fairseq", str(checkpoint_dir))])
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.fixture
def checkpoints(tmp_path) -> Path:
    """fairseq's save by updates: checkpoint_E_U.pt written whole, then copied to checkpoint_last.pt."""
    where = tmp_path / "check points"  # a space: every path in the lines is quoted
    where.mkdir()
    now = time.time()
    save(where / "checkpoint_1_10.pt", 10, now - 300)
    save(where / "checkpoint_1_20.pt", 20, now - 200)
    save(where / "checkpoint_1_30.pt", 30, now - 100)  # the newest, and whole
    return where


def test_a_checkpoint_last_cut_short_during_the_copy_is_replaced_by_the_newest_whole_checkpoint(checkpoints):
    last = checkpoints / "checkpoint_last.pt"
    whole = (checkpoints / "checkpoint_1_30.pt").read_bytes()
    last.write_bytes(whole[: len(whole) // 2])  # the copy stopped half-way
    with pytest.raises(Exception):
        torch.load(last)  # what the requeued job would have hit

    out = set_up(checkpoints)

    assert torch.load(last)["step"] == 30
    assert "resuming from" in out and "checkpoint_1_30.pt" in out
    assert not (checkpoints / "checkpoint_last.pt.tmp").exists()


def test_an_empty_checkpoint_last_is_replaced_even_when_the_newest_file_is_itself_cut_short(checkpoints):
    last = checkpoints / "checkpoint_last.pt"
    last.write_bytes(b"")
    newest = checkpoints / "checkpoint_1_40.pt"
    newest.write_bytes((checkpoints / "checkpoint_1_30.pt").read_bytes()[:100])  # not whole: not chosen
    set_up(checkpoints)
    assert torch.load(last)["step"] == 30


def test_a_whole_checkpoint_last_is_left_alone_even_when_older_files_are_newer_on_disk(checkpoints):
    last = checkpoints / "checkpoint_last.pt"
    save(last, 35, time.time() - 500)  # the primary file of an end-of-epoch save: whole, whatever its mtime
    before = last.read_bytes()
    assert set_up(checkpoints) == ""
    assert last.read_bytes() == before


def test_with_nothing_whole_left_the_cut_file_is_moved_aside_and_training_starts_over(tmp_path):
    last = tmp_path / "checkpoint_last.pt"
    last.write_bytes(b"PK\x03\x04 cut")
    out = set_up(tmp_path)
    assert not last.exists() and (tmp_path / "checkpoint_last.pt.incomplete").read_bytes() == b"PK\x03\x04 cut"
    assert "starts over" in out


def test_a_fresh_job_with_no_checkpoint_runs_the_lines_quietly(tmp_path):
    assert set_up(tmp_path / "not-made-yet") == ""


def test_only_fairseq_jobs_with_a_checkpoint_dir_get_the_lines():
    assert checkpoint_repair_lines("python-module", "/ck") == []
    assert checkpoint_repair_lines("fairseq", None) == []
