"""A run owns its outputs (issue 31; toolkit/submit/outputs.py): two submissions of one recipe never share a
checkpoint dir, continuing another run is explicit (`--resume-from`, a copy made once by the batch set-up), and a
recipe that pins a dir across runs is warned about, naming the run that wrote there."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from tests.jobhelpers import write_cluster
from toolkit.errors import UsageError
from toolkit.submit.plan import SubmitRequest, plan, write_run_dir


def _request(tmp_path, *overrides: str, resume_from: str | None = None) -> SubmitRequest:
    return SubmitRequest("roberta", nodes=1, cluster=str(write_cluster(tmp_path)), queue="cpu", executor="sbatch",
                         overrides=overrides, resume_from=resume_from)


def test_two_submissions_of_a_recipe_never_share_a_checkpoint_dir(tmp_path, monkeypatch):
    """roberta's --save-dir was <root>/checkpoints/roberta for every run: fairseq restores its checkpoint_last.pt,
    so a second run with another learning rate silently continued the first."""
    monkeypatch.setenv("HPC_RUNS_DIR", str(tmp_path / "runs"))
    first = plan(_request(tmp_path, "args.--lr=0.0005"))
    second = plan(_request(tmp_path, "args.--lr=0.0007"))
    dirs = [p.spec.dirs["checkpoints"] for p in (first, second)]
    assert dirs[0] != dirs[1]
    for p in (first, second):
        assert Path(p.spec.dirs["checkpoints"]).is_relative_to(p.run_dir)
        assert p.spec.command[p.spec.command.index("--save-dir") + 1] == p.spec.dirs["checkpoints"]
        assert p.spec.dirs["data"] == "/shared/data-bin/wikitext-103"  # data stays shared
        assert not p.spec.warnings or not any("is also run" in w for w in p.spec.warnings)


def test_a_pinned_dir_another_run_wrote_is_warned_about_naming_that_run(tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_RUNS_DIR", str(tmp_path / "runs"))
    first = plan(_request(tmp_path, "dirs.checkpoints.under=root"))
    write_run_dir(first)
    second = plan(_request(tmp_path, "dirs.checkpoints.under=root"))
    (warning,) = [w for w in second.warnings if "is also run" in w]
    assert first.run_dir.name in warning and "/shared/checkpoints/roberta" in warning


def test_resume_from_seeds_this_runs_checkpoints_once_from_the_other_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_RUNS_DIR", str(tmp_path / "runs"))
    first = plan(_request(tmp_path))
    write_run_dir(first)
    second = plan(_request(tmp_path, resume_from=str(first.run_dir)))
    theirs, mine = first.spec.dirs["checkpoints"], second.spec.dirs["checkpoints"]
    assert second.spec.resume_from == theirs and mine != theirs
    assert any(d.key == "resume from" and d.value == theirs for d in second.spec.derived)  # shown in the plan
    (seed,) = [line for line in second.script.splitlines() if "--resume-from)" in line and line.startswith("if ")]
    # the seed line as the batch shell runs it: copies into an empty dir, leaves a requeue's own alone
    src, dst = tmp_path / "their", tmp_path / "mine dir"
    src.mkdir()
    (src / "checkpoint_last.pt").write_text("theirs")
    line = seed.replace(theirs, shlex.quote(str(src))).replace(mine, shlex.quote(str(dst))).removesuffix(" || exit 1")
    subprocess.run(["bash", "-c", line], check=True, timeout=30)
    assert (dst / "checkpoint_last.pt").read_text() == "theirs"
    (dst / "checkpoint_last.pt").write_text("mine, after a requeue")
    subprocess.run(["bash", "-c", line], check=True, timeout=30)
    assert (dst / "checkpoint_last.pt").read_text() == "mine, after a requeue"
    assert (src / "checkpoint_last.pt").read_text() == "theirs"  # a copy: the other run's files never change


def test_resume_from_an_unknown_run_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_RUNS_DIR", str(tmp_path / "runs"))
    with pytest.raises(UsageError, match="--resume-from 424242: no run dir of that path, and no run of that job id"):
        plan(_request(tmp_path, resume_from="424242"))
