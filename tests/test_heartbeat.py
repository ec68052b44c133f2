"""Heartbeats and hang attribution (toolkit.node.heartbeat), on this machine: the diagnosis over made-up
heartbeats and stacks, and real processes that beat, dump their stacks on SIGWINCH and are ended by rank 0's
watchdog (the path a job without Slurm takes: signals by pid). The E2E on the local Slurm: tests/test_hang_slurm.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from tests.conftest import REPO
from toolkit.node import heartbeat
from toolkit.node.heartbeat import WRITE_SLACK_S, Beat, Diagnosis, diagnose, main_thread_frames

NOW = 1_000_000.0
# faulthandler's text, as a rank blocked in DDP's all-reduce (under backward) and one stuck in its own code write it
WAITING = """Thread 0x00007f00 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/venv/toolkit/workloads/heartbeat.py", line 120 in _write_every_interval
  File "/usr/lib/python3.11/threading.py", line 1045 in _bootstrap

Current thread 0x00007f01 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 829 in _engine_run_backward
  File "/venv/lib/python3.11/site-packages/torch/autograd/__init__.py", line 353 in backward
  File "/venv/lib/python3.11/site-packages/torch/_tensor.py", line 626 in backward
  File "/fsx/train.py", line 44 in main
  File "<string>", line 1 in <module>
"""
STUCK = """Current thread 0x00007f02 (most recent call first):
  File "/fsx/train.py", line 21 in load_batch
  File "/fsx/train.py", line 40 in main
  File "<string>", line 1 in <module>

Thread 0x00007f03 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 1045 in _bootstrap
"""


def beats(steps: list[int | None], progress_ago: list[float], written_ago: list[float] | None = None) -> list[Beat]:
    written_ago = written_ago or [1.0] * len(steps)
    return [Beat(rank, f"n{rank // 2 + 1}", 100 + rank, step, NOW - ago, NOW - wrote, 10.0)
            for rank, (step, ago, wrote) in enumerate(zip(steps, progress_ago, written_ago, strict=True))]


def test_progressing_ranks_are_not_stalled():
    found = diagnose(beats([7, 7, 8, 8], [5, 5, 1, 1]), NOW, after_s=60)
    assert found.stalled == [] and found.lines() == [] and found.steps == (7, 8) and found.ranks == 4


def test_a_rank_is_judged_as_of_its_last_write_so_never_called_stalled_early():
    # 65 s since its last step as of now, but its last write (10 s ago, one interval) saw only 55: it may have
    # stepped since; the next write tells.
    assert diagnose(beats([3], [65], written_ago=[10]), NOW, after_s=60).stalled == []
    assert [s.rank for s in diagnose(beats([3], [65], written_ago=[4]), NOW, after_s=60).stalled] == [0]


def test_the_rank_stuck_outside_communication_is_named_and_the_waiting_ones_are_not():
    stacks = {0: WAITING, 1: WAITING, 2: WAITING, 3: STUCK}
    found = diagnose(beats([4, 4, 4, 4], [140, 140, 140, 140]), NOW, after_s=60, stacks=stacks)
    assert [s.rank for s in found.stalled] == [3] and found.waiting == [0, 1, 2]
    assert found.lines()[0] == "rank 3 on node n2: step 4, no progress for 140 s, at train.py:21 in load_batch"
    assert "ranks 0-2" in found.lines()[1] and "communication" in found.lines()[1]


def test_without_stacks_no_rank_stands_out_so_none_is_named_and_the_way_to_tell_is_said():
    found = diagnose(beats([4, 4], [140, 140]), NOW, after_s=60)
    assert found.stalled == [] and found.waiting == [] and found.stopped
    assert [s.rank for s in found.undecided] == [0, 1]
    assert found.lines() == ["ranks 0-1 made no progress for 140 s (step 4); undecided which rank the others wait "
                             "for: no rank stands out: collect stacks with `hpc jobs status JOB --stacks`"]
    assert found.to_json()["undecided"] == [0, 1]


def test_a_rank_behind_the_others_step_is_the_one_they_wait_for():
    found = diagnose(beats([12, 12, 11, 12], [90, 90, 95, 90]), NOW, after_s=60)
    assert [s.rank for s in found.stalled] == [2] and found.waiting == [0, 1, 3]
    assert found.lines()[-1] == "ranks 0-1, 3 wait for it: the other ranks reached step 12"


def test_a_rank_whose_heartbeat_went_silent_is_frozen_or_gone():
    found = diagnose(beats([5, 5, 5, 5], [100, 100, 100, 100], written_ago=[2, 2, 2, 95]), NOW, after_s=60)
    assert [s.rank for s in found.stalled] == [3] and found.stalled[0].silent_s == 95
    assert "no heartbeat for 95 s (process frozen or gone)" in found.lines()[0]


def frozen_rank_polls(interval: float, after_s: float, freeze_after_write: float) -> list[Diagnosis]:
    """Polls, every half second for 40 s, of 4 ranks in a collective: rank 3 frozen (SIGSTOP) at NOW, right after
    its step 6 (its last write `freeze_after_write` s before the freeze); ranks 0-2 finished step 6 too and wait for
    it in the next all-reduce, their writer threads writing every interval."""
    polls = []
    for tick in range(1, 81):
        now = NOW + tick / 2
        waiting = [Beat(rank, "n1", 100 + rank, 6, NOW - 0.2, now - (now - NOW) % interval, interval)
                   for rank in range(3)]
        polls.append(diagnose([*waiting, Beat(3, "n2", 103, 6, NOW - 0.3, NOW - freeze_after_write, interval)],
                              now, after_s))
    return polls


def test_a_frozen_rank_is_named_or_the_poll_is_undecided_never_a_waiting_rank():
    # What `hpc jobs status` saw here before (issue 35): ranks 0-2 named as stalled for the first 25 s of a
    # SIGSTOP, while rank 3's last write was not yet 3 intervals old.
    for interval, after_s in ((10.0, 3.0), (10.0, 20.0), (1.0, 3.0)):
        polls = [p for p in frozen_rank_polls(interval, after_s, freeze_after_write=0.1) if p.stopped]
        assert polls, (interval, after_s)
        for poll in polls:
            assert [s.rank for s in poll.stalled] in ([3], []), (interval, after_s, poll)
            assert poll.stalled or poll.undecided, poll
        named = [p for p in polls if p.stalled]
        # named once rank 3 missed two timer writes while the others' went on, and from then on every poll
        first = next(i for i, p in enumerate(polls) if p.stalled)
        assert named == polls[first:] and named[0].waiting == [0, 1, 2]
        assert named[0].stalled[0].silent_s <= 2 * interval + WRITE_SLACK_S + 0.5
        assert "their heartbeats go on" in named[0].lines()[-1]
    undecided = [p.lines()[0] for p in frozen_rank_polls(10.0, 3.0, 0.1) if p.undecided]
    assert undecided[0].startswith("ranks 0-2 made no progress for 10 s (step 6); undecided")  # nothing stands out
    assert "rank 3's heartbeat is 21 s old (written every 10 s): if it stays silent" in undecided[-1]  # late


def test_ranks_waiting_for_one_stuck_in_its_own_code_are_undecided_until_stacks_tell():
    # Every heartbeat fresh, every step equal: without stacks nothing says which rank the others wait for.
    found = diagnose(beats([4, 4, 4, 4], [140] * 4), NOW, after_s=60)
    assert found.stalled == [] and [s.rank for s in found.undecided] == [0, 1, 2, 3]
    stacks = {0: WAITING, 1: WAITING, 2: WAITING, 3: STUCK}
    assert [s.rank for s in diagnose(beats([4, 4, 4, 4], [140] * 4), NOW, 60, stacks).stalled] == [3]


def test_the_main_thread_is_the_one_not_started_by_threading():
    assert main_thread_frames(WAITING)[0][2] == "_engine_run_backward"
    assert main_thread_frames(STUCK)[0] == ("/fsx/train.py", 21, "load_batch")


RANK = textwrap.dedent("""
    import sys, time
    from toolkit.node.heartbeat import beat
    def stuck_here():
        while True:
            time.sleep(0.05)
    for step in range(1, 1000):
        if step == int(sys.argv[1]):
            stuck_here()
        beat(step)
        time.sleep(0.05)
""")


def start_ranks(tmp_path: Path, stuck_at: list[int], hang_timeout: float | None = None) -> list[subprocess.Popen]:
    env = dict(os.environ, PYTHONPATH=str(REPO), WORLD_SIZE=str(len(stuck_at)),
               **{heartbeat.DIR_VAR: str(tmp_path / "heartbeats"), heartbeat.INTERVAL_VAR: "0.2"})
    env.pop("SLURM_JOB_ID", None)
    if hang_timeout:
        env[heartbeat.HANG_VAR] = str(hang_timeout)
    return [subprocess.Popen([sys.executable, "-c", RANK, str(at)], env=dict(env, RANK=str(rank)),
                             stderr=subprocess.PIPE, text=True)
            for rank, at in enumerate(stuck_at)]


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {timeout} s")


def test_a_rank_writes_its_step_while_stuck_and_dumps_its_stacks_on_sigwinch_without_dying(tmp_path):
    (rank,) = start_ranks(tmp_path, [5])
    try:
        directory = tmp_path / "heartbeats"
        first = wait_for(lambda: [b for b in heartbeat.read_beats(directory) if b.step == 4], 20, "step 4")[0]
        assert first.pid == rank.pid and first.interval == 0.2
        later = wait_for(lambda: [b for b in heartbeat.read_beats(directory) if b.time > first.time + 0.5], 10,
                         "a newer heartbeat")[0]
        assert later.step == 4 and later.progress == first.progress  # the writer thread goes on, the step does not
        heartbeat.collect_stacks(directory, [later], timeout=5, job_id=None)
        stack = heartbeat.read_stacks(directory)[0]
        assert main_thread_frames(stack)[0][2] == "stuck_here"
        assert rank.poll() is None  # SIGWINCH did not end it
    finally:
        rank.kill()
        rank.wait()


def test_stacks_name_the_rank_that_did_not_answer(tmp_path):
    """A fault probe stopped a rank (SIGSTOP) and asked for stacks: the others' were listed, the frozen one was
    not named at all. (jobs status --stacks's reading: toolkit.submit.runs.progress, on real processes.)"""
    from toolkit.rundir import RunDir
    from toolkit.submit.runs import progress

    ranks = start_ranks(tmp_path, [5, 5])
    try:
        wait_for(lambda: {b.rank for b in heartbeat.read_beats(tmp_path / "heartbeats") if b.step == 4} == {0, 1},
                 20, "both ranks at step 4")
        ranks[1].send_signal(signal.SIGSTOP)
        found = progress(RunDir(tmp_path), None, running=True, stacks=True)
        assert found is not None and list(found["stacks"]) == ["0"] and found["no_stack"] == [1]
        from toolkit.cli.jobs import _progress_lines

        assert any(line.startswith("  no stack from rank(s) 1: asked, they did not answer")
                   for line in _progress_lines(found))
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()


FREEZING_RANK = textwrap.dedent("""
    import os, signal, time
    from toolkit.node.heartbeat import WRITE_GAP_S, beat
    for step in range(1, 8):
        time.sleep(0.05)
        beat(step)
    time.sleep(WRITE_GAP_S + 0.3)  # into step 8's work, then frozen as by SIGSTOP
    os.kill(os.getpid(), signal.SIGSTOP)
""")


def test_a_rank_frozen_after_its_step_7_says_7_though_its_timer_never_wrote(tmp_path):
    # Before (issue 35): written every interval only, so a rank frozen before its first timer write said "no step".
    env = dict(os.environ, PYTHONPATH=str(REPO), RANK="0", **{heartbeat.DIR_VAR: str(tmp_path / "heartbeats"),
                                                              heartbeat.INTERVAL_VAR: "3600"})
    rank = subprocess.Popen([sys.executable, "-c", FREEZING_RANK], env=env)
    try:
        _, status = os.waitpid(rank.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status)
        (frozen,) = heartbeat.read_beats(tmp_path / "heartbeats")
        assert frozen.step == 7 and frozen.timed_steps == 6 and frozen.recent_steps == [2, 3, 4, 5, 6, 7]
        # written after step 7 (within the write gap), never by the 3600 s timer; no tighter bound: a loaded CI
        # machine delayed this write by 0.2 s
        assert frozen.time - frozen.progress <= heartbeat.WRITE_GAP_S + 0.3
    finally:
        rank.kill()
        rank.wait()


def test_rank_0s_watchdog_ends_a_stalled_job_naming_the_stuck_rank(tmp_path):
    ranks = start_ranks(tmp_path, [10_000, 10_000, 6], hang_timeout=1.5)
    try:
        codes = [r.wait(timeout=30) for r in ranks]
    finally:
        for r in ranks:
            r.kill()
    assert all(code != 0 for code in codes)  # ended by the watchdog's SIGTERM
    hang = json.loads((tmp_path / heartbeat.HANG_FILE).read_text())
    # Nothing blocks ranks 0 and 1 here (no collective): they go on, so only rank 2 stalled.
    assert [s["rank"] for s in hang["stalled"]] == [2] and hang["stalled"][0]["step"] == 5
    assert hang["stalled"][0]["where"].endswith("in stuck_here") and hang["hang_timeout_s"] == 1.5
    err = ranks[0].stderr.read()
    assert "hpc: hang: rank 2 on node" in err and "ending the job: no progress for 1.5 s" in err


def test_a_hang_named_on_evidence_is_a_strike_for_its_node_and_an_undecided_one_is_none(tmp_path, monkeypatch):
    from toolkit.node import heartbeat, ledger

    monkeypatch.setenv(ledger.FLEET_DIR_ENV, str(tmp_path / "fleet"))
    frozen = heartbeat.Stall(3, "c2", 7, 40.0, silent_s=25.0)
    named = heartbeat.Diagnosis([frozen], [0, 1, 2], 4, (7, 8), "its heartbeat stopped while the others' go on")
    assert heartbeat.record_hang(named, "88") == 1
    undecided = heartbeat.Diagnosis([], [], 4, (7, 8), "no evidence yet", undecided=[frozen])
    assert heartbeat.record_hang(undecided, "89") == 0
    [record] = ledger.read(tmp_path / "fleet")
    assert (record["node"], record["source"], record["check"], record["kind"], record["job"]) == \
        ("c2", "hang", "frozen-rank", "lost", "88")
    assert "rank 3 on node c2: step 7" in record["evidence"]


def test_beats_that_cannot_be_written_are_no_evidence_of_a_hang(tmp_path, monkeypatch, capsys):
    """A fault probe made the run dir read-only mid-job: every rank's beats went stale while all trained on, rank
    0's watchdog judged all 4 hung, and only its failing hang.json write (a traceback) kept it from ending a healthy
    job. Rank 0 knows its own writes fail: it judges no hang then, and again only once the others have had time to
    write. A hang seen after that still ends the job. (Ending and stack collection are recorded, not done.)"""
    directory = tmp_path / "heartbeats"
    directory.mkdir()
    other = heartbeat.Heartbeat(directory, rank=1)
    other.step, other.progress = 3, time.time() - 60  # no progress for a minute: a hang, were the files right
    other.write()
    ended: list = []
    monkeypatch.setattr(heartbeat, "end_job", lambda beats, job_id: ended.append(job_id))
    monkeypatch.setattr(heartbeat, "collect_stacks", lambda *args, **kwargs: None)
    monkeypatch.setattr(heartbeat, "record_hang", lambda found, job_id: 0)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    rank0 = heartbeat.Heartbeat(directory, rank=0, interval=0.1, hang_timeout=0.5)

    def read_only() -> None:
        raise PermissionError(13, "Permission denied", str(rank0.path))

    monkeypatch.setattr(rank0, "write", read_only)
    rank0._write_quietly()
    watchdog = threading.Thread(target=rank0._watch, daemon=True)
    watchdog.start()
    time.sleep(1.0)
    assert ended == [] and not (tmp_path / heartbeat.HANG_FILE).exists()
    assert "the heartbeats cannot be written" in capsys.readouterr().err
    monkeypatch.undo()  # writes work again (and the stand-ins go: put them back)
    monkeypatch.setattr(heartbeat, "end_job", lambda beats, job_id: ended.append(job_id))
    monkeypatch.setattr(heartbeat, "collect_stacks", lambda *args, **kwargs: None)
    monkeypatch.setattr(heartbeat, "record_hang", lambda found, job_id: 0)
    rank0._write_quietly()
    watchdog.join(timeout=10)
    assert ended == [None] and (tmp_path / heartbeat.HANG_FILE).exists()


def test_a_hang_timeout_for_a_program_that_writes_no_heartbeats_is_warned_of(tmp_path):
    """A fault probe set --hang-timeout 15 on a program that never beats and stopped a rank for 35 s: nothing
    happened, and nothing had said it would. Our workloads that beat are listed; the list is held to their code."""
    from toolkit.job.spec import heartbeat_warnings
    from toolkit.launchers.trainer import BEATING_WORKLOADS
    from toolkit.recipes.load import load_recipe
    from tests.jobhelpers import probe_recipe

    beating = {f"toolkit.workloads.{p.stem}" for p in (REPO / "toolkit" / "workloads").glob("*.py")
               if "heartbeat.beat(" in p.read_text()}
    assert set(BEATING_WORKLOADS) == beating
    assert heartbeat_warnings(load_recipe("resnet50", overrides=["resources.hang_timeout_s=15"])) == []
    probe = probe_recipe(tmp_path)
    assert heartbeat_warnings(load_recipe(str(probe))) == []  # no timeout: nothing to warn of
    [warning] = heartbeat_warnings(load_recipe(str(probe), overrides=["resources.hang_timeout_s=15"]))
    assert "hang timeout (15 s) works from the ranks' heartbeats" in warning and "beat(step)" in warning
