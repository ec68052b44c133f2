"""A requeued fairseq job resumes from a whole checkpoint_last.pt: the line the fairseq launcher
(toolkit.launchers.fairseq) puts in the rank program, run by bash on checkpoints torch really wrote, the way fairseq
0.12 leaves them when a job is stopped during its copy."""

from __future__ import annotations

import os
import pickle
import subprocess
import time
from pathlib import Path

import pytest

from toolkit.job.rank import rank_program
from toolkit.launchers import launcher_for


@pytest.fixture
def torch():
    """The training environment's torch, for the tests marked `training`: collecting this module needs none."""
    import torch

    return torch


def save(path: Path, step: int, mtime: float) -> None:
    import torch

    torch.save({"step": step, "weights": torch.arange(1000) * step}, path)
    os.utime(path, (mtime, mtime))


def rank_start(checkpoint_dir: Path, ranks: int = 1) -> str:
    """What `ranks` ranks of a fairseq job run before fairseq, all at once, as their rank program's bash runs it
    (then `exec "$0"`: here `true`); what they said."""
    program = rank_program(("true",), ranks, ranks, contract=True,
                           prelude=launcher_for("fairseq").resume_script(str(checkpoint_dir)))
    env = {"PATH": "/usr/bin:/bin", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    procs = [subprocess.Popen(program.argv, env={**env, "SLURM_PROCID": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(ranks)]
    said = ""
    for proc in procs:
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        said += out + err
    return said


@pytest.fixture
def checkpoints(tmp_path) -> Path:
    """fairseq's save by updates: checkpoint_E_U.pt written whole, then copied to checkpoint_last.pt (torch writes
    them: for tests marked `training`)."""
    where = tmp_path / "check points"  # a space: every path in the lines is quoted
    where.mkdir()
    now = time.time()
    save(where / "checkpoint_1_10.pt", 10, now - 300)
    save(where / "checkpoint_1_20.pt", 20, now - 200)
    save(where / "checkpoint_1_30.pt", 30, now - 100)  # the newest, and whole
    return where


@pytest.mark.training
def test_a_checkpoint_last_cut_short_during_the_copy_is_replaced_by_the_newest_whole_checkpoint(checkpoints, torch):
    last = checkpoints / "checkpoint_last.pt"
    whole = (checkpoints / "checkpoint_1_30.pt").read_bytes()
    last.write_bytes(whole[: len(whole) // 2])  # the copy stopped half-way
    # how torch refuses a cut zip depends on where it was cut: its zip reader (RuntimeError), a seek (OSError),
    # or the unpickler (EOFError, UnpicklingError)
    with pytest.raises((RuntimeError, OSError, EOFError, pickle.UnpicklingError)):
        torch.load(last)  # what the requeued job would have hit

    out = rank_start(checkpoints)

    assert torch.load(last)["step"] == 30
    assert "resuming from" in out and "checkpoint_1_30.pt" in out
    assert not (checkpoints / "checkpoint_last.pt.tmp").exists()


@pytest.mark.training
def test_an_empty_checkpoint_last_is_replaced_even_when_the_newest_file_is_itself_cut_short(checkpoints, torch):
    last = checkpoints / "checkpoint_last.pt"
    last.write_bytes(b"")
    newest = checkpoints / "checkpoint_1_40.pt"
    newest.write_bytes((checkpoints / "checkpoint_1_30.pt").read_bytes()[:100])  # not whole: not chosen
    rank_start(checkpoints)
    assert torch.load(last)["step"] == 30


@pytest.mark.training
def test_a_whole_checkpoint_last_is_left_alone_even_when_older_files_are_newer_on_disk(checkpoints):
    last = checkpoints / "checkpoint_last.pt"
    save(last, 35, time.time() - 500)  # the primary file of an end-of-epoch save: whole, whatever its mtime
    before = last.read_bytes()
    assert rank_start(checkpoints) == ""
    assert last.read_bytes() == before


def test_with_nothing_whole_left_the_cut_file_is_moved_aside_and_training_starts_over(tmp_path):
    last = tmp_path / "checkpoint_last.pt"
    last.write_bytes(b"PK\x03\x04 cut")
    out = rank_start(tmp_path)
    assert not last.exists() and (tmp_path / "checkpoint_last.pt.incomplete").read_bytes() == b"PK\x03\x04 cut"
    assert "starts over" in out


def test_a_fresh_job_with_no_checkpoint_runs_the_lines_quietly(tmp_path):
    assert rank_start(tmp_path / "not-made-yet") == ""


@pytest.mark.training
def test_eight_ranks_repairing_at_once_leave_one_whole_file_and_no_temporary_ones(checkpoints, torch):
    last = checkpoints / "checkpoint_last.pt"
    last.write_bytes(b"")
    rank_start(checkpoints, ranks=8)
    assert torch.load(last)["step"] == 30
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "checkpoint_1_10.pt", "checkpoint_1_20.pt", "checkpoint_1_30.pt", "checkpoint_last.pt"]


def test_only_fairseq_jobs_with_a_checkpoint_dir_get_the_line():
    assert launcher_for("python-module").resume_script("/ck") == ""
    assert launcher_for("fairseq").resume_script(None) == ""


def test_the_fairseq_recipes_rank_program_repairs_its_own_checkpoint_dir_before_fairseq_starts():
    from toolkit.recipes.load import load_recipe
    from toolkit.cluster.queues import default_queue
    from toolkit.slurm.materialize import build_job_spec

    spec = build_job_spec(load_recipe("roberta", profile="smoke"), default_queue(), 1, run_dir="/fsx/runs/r1")
    script = spec.program.script
    assert launcher_for("fairseq").resume_script(spec.dirs["checkpoints"]) in script
    assert script.index("checkpoint_last.pt") < script.index('exec "$0"')
