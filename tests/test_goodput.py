"""The goodput ledger (toolkit.reports.goodput) over run dirs written by the real writers (RunDir's records, our
trainer's TrainLog, the heartbeat), at times set by hand, so every segment's seconds can be checked by hand. The
E2E ledgers (a lost node under spares, a requeue by a failed pre-flight): tests/test_spares_slurm.py and
tests/test_preflight_slurm.py."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from tests.conftest import run_hpc
from toolkit.node.heartbeat import Heartbeat, read_beats
from toolkit.reports.goodput import ledger
from toolkit.rundir import Metadata, RankRecord, RunDir
from toolkit.workloads import train_log
from toolkit.workloads.train_log import TrainLog

T0 = 1_800_000_000.0


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="seconds")


class Clock:
    now = T0

    def __call__(self) -> float:
        return self.now


def step_log(run: RunDir, monkeypatch: pytest.MonkeyPatch):
    """(at, train): write the trainer's step log records (TrainLog) at T0 + t seconds."""
    clock = Clock()
    monkeypatch.setattr(train_log.time, "time", clock)
    log = TrainLog(run.path / "logs", enabled=True)

    def at(t: float, event: str, **fields) -> None:
        clock.now = T0 + t
        log.write(event, **fields)

    def train(t: float, step: int) -> None:
        at(t, "train", step=step, epoch=0, loss=1.0, lr=0.1, images_per_sec=1.0, world_size=8, elapsed=0,
           interval_steps=1, interval_images=8, interval_seconds=1.0)

    return at, train


def first_round(at, train, start: float) -> None:
    """The trainer starts at `start`; steps 1-4 one a second from start + 2 (step 1) to start + 5, a save at step
    4 (0.5 s), steps 5 and 6 at start + 6.5 and start + 7.5."""
    at(start, "start", resumed_from_step=0)
    for step in (1, 2, 3, 4):
        train(start + 1 + step, step)
    at(start + 5.5, "checkpoint", step=4, epoch=0, position=4, reason="periodic", seconds=0.5)
    train(start + 6.5, 5)
    train(start + 7.5, 6)


def write_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunDir:
    """Submitted at T0; a pre-flight requeues the job (10-12 s), the next passes (30-31 s); the trainer starts at
    33 s, steps 1-4 take a second each from 34 s, saves at step 4 (0.5 s), makes steps 5 and 6 and loses its node
    (the supervisor's restart at 45 s); the next round resumes from step 4 at 50 s, makes steps 5-8 from 51 s to
    55 s and ends; rank 0's result says 57 s."""
    run = RunDir(tmp_path / "run").create()
    run.write_metadata(Metadata(recipe="resnet50", submitted_at=iso(T0), nodes=1, gpus=8,
                                instance_type="p4d.24xlarge", job_ids=["9"]))
    run.add_preflight({"job": "9", "time": T0 + 12, "seconds": 2.0, "nodes": ["w1", "w2"], "failed": {"w2": []},
                       "action": "requeued, excluding w2 (job 10)"})
    run.add_preflight({"job": "9", "time": T0 + 31, "seconds": 1.0, "nodes": ["w1", "w3"], "failed": {},
                       "action": "passed"})
    at, train = step_log(run, monkeypatch)

    first_round(at, train, 33)
    run.add_restart({"time": T0 + 45, "job_id": "9", "kind": "restart", "round": 1, "nodes": ["c2"],
                     "trigger": "heartbeats silent: ranks 0-1 on c2", "last_step": 6})
    at(50, "start", resumed_from_step=4)
    for step, t in ((5, 52), (6, 53), (7, 54), (8, 55)):
        train(t, step)
    at(56, "end", status="completed", step=8, epoch=0, elapsed=0)
    run.write_result(RankRecord(rank=0, host="c1", exit_code=0, finished_at=iso(T0 + 57), ok=True))
    return run


def test_a_ledger_from_real_records_adds_up_to_the_second(tmp_path, monkeypatch):
    found = ledger(write_run(tmp_path, monkeypatch))
    assert found.outcome == "completed" and found.step_source == "logs/train_log.jsonl" and found.missing == []
    shown = [(s.kind, round(s.start - T0, 3), round(s.end - T0, 3)) for s in found.segments]
    assert shown == [("queue", 0, 10), ("preflight", 10, 12), ("requeue", 12, 30), ("preflight", 30, 31),
                     ("startup", 31, 34), ("productive", 34, 38), ("checkpoint", 38, 38.5), ("lost", 38.5, 40.5),
                     ("downtime", 40.5, 51), ("productive", 51, 55), ("shutdown", 55, 57)]
    summary = found.summary()
    assert summary["wall_s"] == 57 and summary["unattributed_s"] == 0 and summary["attributed_s"] == 57
    assert summary["seconds"]["productive"] == 8 and summary["goodput"] == round(8 / 57, 4)
    assert summary["paid_s"] == 57 - 10 - 18 and summary["gpu_hours"] == round(29 / 3600 * 8, 4)
    [fault] = found.faults
    assert (fault.last_step, fault.resumed_from, fault.steps_lost, fault.lost_s, fault.downtime_s) == (6, 4, 2, 2.0,
                                                                                                      10.5)
    assert fault.cause == "restart on a spare: heartbeats silent: ranks 0-1 on c2"
    lost_steps = sum(s.steps for s in found.segments if s.kind == "lost")
    assert lost_steps == pytest.approx(2) and sum(s.steps for s in found.segments if s.kind == "productive") == 8


def test_an_older_run_dir_gets_a_ledger_naming_what_it_lacks(tmp_path, monkeypatch):
    run = write_run(tmp_path, monkeypatch)
    meta = json.loads((run.path / "metadata.json").read_text())
    del meta["submitted_at"]
    (run.path / "metadata.json").write_text(json.dumps(meta))
    (run.path / "preflight.jsonl").unlink()
    found = ledger(run)
    assert any("submitted_at" in m for m in found.missing) and any("preflight.jsonl" in m for m in found.missing)
    # without the submission and the pre-flights the ledger starts at the first step and still adds up
    assert found.start == T0 + 34 and found.summary()["wall_s"] == 23
    assert found.summary()["seconds"]["productive"] == 8 and found.faults[0].steps_lost == 2


def test_a_failed_run_loses_its_tail_after_the_last_checkpoint(tmp_path, monkeypatch):
    run = write_run(tmp_path, monkeypatch)
    lines = (run.path / "logs" / "train_log.jsonl").read_text().splitlines()
    (run.path / "logs" / "train_log.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # no end record
    (run.path / "result.json").unlink()
    run.write_failure(RankRecord(rank=0, host="c1", exit_code=1, finished_at=iso(T0 + 57)))
    found = ledger(run)
    assert found.outcome == "failed"
    # steps 5-8 of the last round came after the last checkpoint (step 4): 4 s of tail, then the failure
    assert found.summary()["seconds"]["tail"] == 4 and found.summary()["seconds"]["productive"] == 4
    assert found.segments[-1].kind == "downtime" and found.segments[-1].seconds == 2


def test_a_run_whose_ranks_were_killed_is_signalled_not_failed(tmp_path, monkeypatch):
    """A fault probe cancelled a job (scancel: SIGTERM to every rank): the ledger said "failed", Slurm CANCELLED.
    Killed first, and no rank failed by itself: signalled (its tail still lost); one that did fail by itself, even
    among killed ones, is still a failure."""
    run = write_run(tmp_path, monkeypatch)
    lines = (run.path / "logs" / "train_log.jsonl").read_text().splitlines()
    (run.path / "logs" / "train_log.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    (run.path / "result.json").unlink()
    for rank in (0, 1):
        run.write_failure(RankRecord(rank=rank, host="c1", exit_code=-15, finished_at=iso(T0 + 57)))
    found = ledger(run)
    assert found.outcome == "signalled" and found.summary()["seconds"]["tail"] == 4
    assert found.segments[-1].kind == "shutdown"
    # our spares supervisor gave up and killed the ranks: a failure, whatever signal ended them
    run.add_restart({"time": T0 + 56, "job_id": "9", "kind": "gave_up", "round": 2, "nodes": ["c1"]})
    assert ledger(run).outcome == "failed"
    (run.path / "restarts.jsonl").unlink()
    run.write_failure(RankRecord(rank=1, host="c1", exit_code=1, finished_at=iso(T0 + 57)))  # srun killed rank 0
    assert ledger(run).outcome == "failed"


def test_a_scripts_checkpoint_time_reaches_its_heartbeat(tmp_path):
    beat = Heartbeat(tmp_path, rank=0)
    beat.beat(1)
    beat.beat(2, checkpoint=0.25)
    beat.beat(3)
    beat.beat(4, checkpoint=0.5)
    beat.write()
    [read] = read_beats(tmp_path)
    assert read.checkpoint is not None and (read.checkpoint["count"], read.checkpoint["total_s"]) == (2, 0.75)
    assert (read.checkpoint["step"], read.checkpoint["seconds"]) == (4, 0.5) and read.timed_steps == 3
    assert set(read.medians) == {"step"}  # a save is no phase of every step


def test_the_goodput_command_prints_the_ledger_and_its_json(tmp_path, monkeypatch):
    run = write_run(tmp_path, monkeypatch)
    res = run_hpc("report", "goodput", str(run.path), "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)["data"]
    [one] = data["runs"]
    assert one["wall_s"] == 57 and one["seconds"]["lost"] == 2 and one["price"] == "no price"
    assert data["totals"]["goodput"] == round(8 / 57, 4)
    text = run_hpc("report", "goodput", str(run.path), "--plot", str(tmp_path / "g.png")).stdout
    assert "productive" in text and "14.0%" in text and (tmp_path / "g.png").stat().st_size > 1000


def test_fairseqs_own_lines_time_its_steps_and_saves(tmp_path):
    """fairseq 0.12's stdout (--log-format json): its train_inner records and checkpoint_utils' save line."""
    run = RunDir(tmp_path / "run").create()
    run.write_metadata(Metadata(recipe="roberta", job_ids=["7"], executor=None))
    lines = ["2024-05-01 10:00:00 | INFO | fairseq_cli.train | training on 2 devices (GPUs/TPUs)",
             "2024-05-01 10:00:01 | INFO | fairseq.checkpoint_utils | No existing checkpoint found checkpoint_last.pt"]
    lines += [f'2024-05-01 10:00:{2 + 2 * n:02d} | INFO | train_inner | {{"epoch": 1, "loss": "9.1", "wps": "100", '
              f'"num_updates": "{2 * n}"}}' for n in range(1, 5)]
    lines.insert(4, "2024-05-01 10:00:07 | INFO | fairseq.checkpoint_utils | Saved checkpoint checkpoints/"
                    "checkpoint_1_4.pt (epoch 1 @ 4 updates, score None) (writing took 1.5 seconds)")
    (run.path / "roberta-7.out").write_text("\n".join(lines) + "\n")
    found = ledger(run)
    local = dt.datetime(2024, 5, 1, 10, 0, 0).timestamp()  # fairseq logs the node's local time
    assert found.step_source == "roberta-7.out" and found.start == local + 4
    shown = [(s.kind, round(s.start - local, 3), round(s.end - local, 3)) for s in found.segments]
    # steps 2-4 from 4 s to 6 s; the save ends at 7 s in the interval to step 6 (6-8 s), and is clipped to it (its
    # 1.5 s reach back past 6 s: fairseq's times are whole seconds)
    assert shown == [("productive", 4, 6), ("checkpoint", 6, 7), ("productive", 7, 10)], shown


def test_the_end_is_the_logs_last_write_unless_the_run_dir_was_copied(tmp_path, monkeypatch):
    import os

    run = write_run(tmp_path, monkeypatch)
    log = run.path / "logs" / "train_log.jsonl"
    os.utime(log, (T0 + 58.5, T0 + 58.5))  # the batch shell wrote the log after rank 0's result (57 s)
    found = ledger(run)
    assert found.end == T0 + 58.5 and found.segments[-1].kind == "shutdown" and found.segments[-1].seconds == 3.5
    assert "1.5 s after the last record" in found.notes[0]
    os.utime(log, (T0 + 3600, T0 + 3600))  # a copy's time: not the job's
    assert ledger(run).end == T0 + 57


def write_hung_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, resumed: bool) -> RunDir:
    """Submitted at T0, its pre-flight passes (2-3 s); steps 1-4 from 4 s to 8 s, a save at step 4 (8-8.5 s),
    steps 5 and 6 at 9.5 s and 10.5 s; then no rank makes progress and the hang watchdog (HPC_HANG_TIMEOUT=30) ends
    the job at 40.5 s, writing hang.json as toolkit.node.heartbeat.Heartbeat._watch does; rank 0's failure says
    42 s. With `resumed`, the job runs again: it resumes from step 4 at 50 s, makes steps 5-8 from 51 s to 55 s and
    ends at 56 s."""
    run = RunDir(tmp_path / "run").create()
    run.write_metadata(Metadata(recipe="resnet50", submitted_at=iso(T0), nodes=1, gpus=8,
                                instance_type="p4d.24xlarge", job_ids=["9"]))
    run.add_preflight({"job": "9", "time": T0 + 3, "seconds": 1.0, "nodes": ["c1", "c2"], "failed": {},
                       "action": "passed"})
    at, train = step_log(run, monkeypatch)

    first_round(at, train, 3)
    lines = ["rank 3 on c2: no step for 30 s after step 6 (its stack: all_reduce)"]
    (run.path / "hang.json").write_text(json.dumps({"time": T0 + 40.5, "hang_timeout_s": 30.0, "lines": lines}))
    run.write_failure(RankRecord(rank=0, host="c1", exit_code=1, finished_at=iso(T0 + 42)))
    if resumed:
        at(50, "start", resumed_from_step=4)
        for step, t in ((5, 52), (6, 53), (7, 54), (8, 55)):
            train(t, step)
        at(56, "end", status="completed", step=8, epoch=0, elapsed=0)
    return run


def test_a_hang_is_its_own_segment_until_the_watchdog_ended_the_job(tmp_path, monkeypatch):
    """The seconds from the last step before the hang to the watchdog's end of the job are the hang's, not steps'
    or shutdown's; the steps after the last save are the failed run's tail."""
    found = ledger(write_hung_run(tmp_path, monkeypatch, resumed=False))
    assert found.outcome == "failed"
    shown = [(s.kind, round(s.start - T0, 3), round(s.end - T0, 3)) for s in found.segments]
    assert shown == [("queue", 0, 2), ("preflight", 2, 3), ("startup", 3, 4), ("productive", 4, 8),
                     ("checkpoint", 8, 8.5),
                     ("tail", 8.5, 10.5), ("hang", 10.5, 40.5), ("downtime", 40.5, 42)], shown
    assert "rank 3 on c2" in next(s.note for s in found.segments if s.kind == "hang")
    assert found.summary()["seconds"]["hang"] == 30 and found.summary()["unattributed_s"] == 0


def test_a_run_that_resumed_after_a_hang_names_the_hang_as_its_faults_cause(tmp_path, monkeypatch):
    found = ledger(write_hung_run(tmp_path, monkeypatch, resumed=True))
    assert found.outcome == "completed" and found.summary()["seconds"]["hang"] == 30
    [fault] = found.faults
    assert fault.cause == "hang: rank 3 on c2: no step for 30 s after step 6 (its stack: all_reduce)"
    assert (fault.last_step, fault.resumed_from, fault.steps_lost) == (6, 4, 2)
