"""Training logs: fairseq JSON lines (tagged and --log-file) and our ResNet trainer's train_log.jsonl.

Trainer logs here are written by the trainer's own writer (toolkit.workloads.train_log.TrainLog) with the
fields toolkit.workloads.resnet.Trainer passes it; one test reads a log the real trainer wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.conftest import REPO, free_port
from toolkit.errors import HpcError
from toolkit.launchers.fairseq.log import FAIRSEQ_FIX
from toolkit.reports.training_logs import (parse_training_file, parse_training_text, summarize_training,
                                           throughput)
from toolkit.workloads.train_log import LOG_NAME, TrainLog, read_log, steady_throughput

FAIRSEQ = Path(__file__).parent / "fixtures" / "training" / "fairseq_translation.sample.txt"


def test_fairseq_stdout_kinds_values_and_warm_up_excluded():
    log = parse_training_file(FAIRSEQ)
    assert log.format == "fairseq" and log.unit == "words/s" and log.loss_base == "2"
    assert [p.kind for p in log.points] == ["train_inner"] * 3 + ["valid", "train"]
    s = summarize_training(log)
    # the first interval (wps "0") is warm-up; then 1000 w/s for 2 s and 400 w/s for 4 s -> 3600 words / 6 s
    assert s["throughput"] == pytest.approx(600.0) and "excluded" in s["throughput_note"]
    assert s["updates"] == 6 and s["final_loss"] == 11.003 and s["epochs"] == 1
    assert s["loss_curve"] == [[2, 13.912], [4, 12.104], [6, 11.003]] and s["valid_curve"] == [[6, 10.512, None]]
    assert s["starts"] is None and s["trainer_summary"] is None


def test_fairseq_log_file_is_bare_json_and_gives_the_same_records():
    bare = "\n".join(line.split(" | ", 3)[3] for line in FAIRSEQ.read_text().splitlines() if "{" in line)
    tagged, untagged = parse_training_file(FAIRSEQ), parse_training_text(bare)
    assert [(p.kind, p.update, p.loss) for p in untagged.points] == [(p.kind, p.update, p.loss) for p in tagged.points]


def test_fairseq_whole_second_wall_clock_falls_back_to_updates_per_second():
    # a fast run: every line says wall "3"; 2 updates at 1 ups (2 s, 100 w/s), then 2 at 4 ups (0.5 s, 400 w/s)
    lines = [json.dumps({"epoch": 1, "loss": "3.0", "wps": wps, "ups": ups, "num_updates": str(n), "wall": "3"})
             for n, wps, ups in [(2, "0", "0"), (4, "100", "1"), (6, "400", "4")]]
    value, note = throughput(parse_training_text("\n".join(lines)))
    assert value == pytest.approx((100 * 2 + 400 * 0.5) / 2.5) and "updates / ups" in note


def test_fairseq_intervals_without_a_clock_fall_back_to_the_plain_mean():
    lines = [json.dumps({"epoch": 1, "loss": "3.0", "wps": wps, "num_updates": str(i)})
             for i, wps in enumerate(["1", "10", "20"], 1)]
    value, note = throughput(parse_training_text("\n".join(lines)))
    assert value == 15.0 and "plain mean" in note


class Attempt(NamedTuple):
    """One start of the trainer: from which step, the images/s of each logged interval, how it ended."""
    resumed_from: int
    rates: list[float]
    val_top1: float | None = None  # an epoch end (validation) after the last interval
    status: str | None = "completed"  # None: killed, no `end` record
    loss_offset: float = 0.0


EVERY, BATCH = 2, 16  # steps per logged interval, images per rank and step


def interval_images(world_size: int) -> int:
    return EVERY * BATCH * world_size


def write_trainer_log(log_dir: Path, attempts: list[Attempt], world_size: int = 2) -> Path:
    """train_log.jsonl as the trainer writes it (its TrainLog, its record fields), one attempt after another."""
    images = interval_images(world_size)
    for attempt in attempts:
        log = TrainLog(log_dir, enabled=True)  # a new process per attempt, appending to the same file
        log.write("start", world_size=world_size, backend="gloo", device="cpu", threads=1, amp=False,
                  arch="resnet18", batch_size=BATCH, global_batch_size=BATCH * world_size, steps_per_epoch=44,
                  total_steps=44, max_steps=None, resumed_from_step=attempt.resumed_from)
        step, elapsed = attempt.resumed_from, 1.5
        for rate in attempt.rates:
            step, seconds = step + EVERY, images / rate
            elapsed += seconds
            log.write("train", step=step, epoch=0, loss=10.0 / step + attempt.loss_offset, lr=0.1,
                      images_per_sec=rate, world_size=world_size, elapsed=round(elapsed, 3), interval_steps=EVERY,
                      interval_images=images, interval_seconds=round(seconds, 6))
        if attempt.val_top1 is not None:
            log.write("val", epoch=0, step=step, top1=attempt.val_top1, loss=0.5, images=360)
            log.write("checkpoint", step=step, epoch=1, position=0, reason="epoch", seconds=0.2)
        if attempt.status:
            log.write("end", status=attempt.status, step=step, epoch=1 if attempt.val_top1 is not None else 0,
                      elapsed=round(elapsed + 1, 3), steady_images_per_sec=steady_throughput(log.records),
                      top1=attempt.val_top1)
    return log_dir / LOG_NAME


def test_trainer_log_curves_validation_and_summary(tmp_path):
    path = write_trainer_log(tmp_path, [Attempt(0, [10.0, 40.0, 80.0], val_top1=87.5)])
    log = parse_training_file(path)
    s = summarize_training(log)
    assert (log.format, s["unit"], s["loss_base"], s["updates"], s["epochs"]) == ("resnet", "images/s", "e", 6, 1)
    # warm-up (the first interval) excluded: 2 x 64 images in 64/40 + 64/80 s
    assert s["throughput"] == pytest.approx(128 / (64 / 40 + 64 / 80)) == pytest.approx(160 / 3)
    assert "first interval after each of 1 start(s) excluded" in s["throughput_note"]
    assert s["throughput"] == pytest.approx(s["trainer_summary"]["steady_images_per_sec"])  # the trainer's own figure
    assert s["loss_curve"] == [[2, 5.0], [4, 2.5], [6, pytest.approx(10 / 6)]]
    assert s["valid_curve"] == [[6, 0.5, 87.5]] and s["final_top1"] == 87.5
    assert (s["status"], s["starts"]) == ("completed", 1)


def test_a_requeued_run_keeps_the_last_record_per_step_and_each_starts_warm_up_is_excluded(tmp_path):
    # killed after step 6 (checkpoint at step 2), requeued: steps 4 and 6 are trained and logged again
    path = write_trainer_log(tmp_path, [Attempt(0, [8.0, 32.0, 32.0], status=None),
                                        Attempt(2, [4.0, 16.0, 16.0], status="max_steps", loss_offset=1.0)])
    s = summarize_training(parse_training_file(path))
    assert s["loss_curve"] == [[2, 5.0], [4, 3.5], [6, pytest.approx(10 / 6 + 1)], [8, 2.25]]
    # kept: steps 4, 6 of the first start (64 images at 32/s each), steps 6, 8 of the second (at 16/s)
    assert s["throughput"] == pytest.approx(256 / (2 * 64 / 32 + 2 * 64 / 16))
    assert "each of 2 start(s)" in s["throughput_note"]
    assert (s["updates"], s["status"], s["starts"], s["final_top1"], s["epochs"]) == (8, "max_steps", 2, None, 0)


def test_too_few_intervals_use_everything_and_say_so(tmp_path):
    log = parse_training_file(write_trainer_log(tmp_path, [Attempt(0, [30.0])]))
    value, note = throughput(log)
    assert value == pytest.approx(30.0) and "too few" in note


def test_trainer_records_without_their_interval_fields_are_not_counted():
    lines = [json.dumps({"event": "start", "world_size": 1}),
             json.dumps({"event": "train", "step": 2, "images_per_sec": 5.0}),  # no interval_* fields
             json.dumps({"event": "unknown", "step": 3})]
    log = parse_training_text("\n".join(lines))
    assert log.format == "resnet" and log.points == [] and throughput(log) == (None, "no training intervals in the log")


def test_a_file_without_records_is_a_clear_error(tmp_path):
    (tmp_path / "x.log").write_text("nothing here\n{\"unrelated\": 1}\n")
    with pytest.raises(HpcError) as err:
        parse_training_file(tmp_path / "x.log")
    assert "no training records" in err.value.message


@pytest.mark.training
def test_a_real_trainer_log_restarted_without_its_checkpoint(tmp_path):
    """The real trainer, 1 rank, on the images smoke data: 6 steps, then a restart (other seed, no checkpoint)
    that logs steps 3 and 6 again and finishes the epoch with a validation."""
    subprocess.run([sys.executable, "-m", "toolkit.workloads.smoke_data", "images", str(tmp_path / "data")],
                   check=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in ("RANK", "WORLD_SIZE")}
    env.update(PYTHONPATH=str(REPO), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    base = [sys.executable, "-m", "toolkit.workloads.resnet", "--data", str(tmp_path / "data"), "--arch", "resnet18",
            "--batch-size", "128", "--image-size", "16", "--epochs", "1", "--log-every-steps", "3", "--workers", "0",
            "--threads", "2", "--log-dir", str(tmp_path / "logs")]
    for extra in (["--max-steps", "6", "--seed", "0"], ["--seed", "1"]):
        res = subprocess.run([*base, *extra], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
        assert res.returncode == 0, res.stdout + res.stderr

    records = read_log(tmp_path / "logs" / LOG_NAME)
    train = [r for r in records if r["event"] == "train"]
    [val] = [r for r in records if r["event"] == "val"]
    assert [r["step"] for r in train] == [3, 6, 3, 6, 9, 11]  # 1437 images: 11 full batches of 128
    assert train[0]["loss"] != train[2]["loss"]  # two seeds: which record of step 3 is kept shows
    s = summarize_training(parse_training_file(tmp_path / "logs" / LOG_NAME))
    assert s["loss_curve"] == [[r["step"], r["loss"]] for r in train[2:]]
    kept = [train[1], *train[3:]]  # the first interval after each start is warm-up
    assert s["throughput"] == pytest.approx(sum(r["interval_images"] for r in kept)
                                            / sum(r["interval_seconds"] for r in kept))
    assert s["valid_curve"] == [[11, val["loss"], val["top1"]]] and s["final_top1"] == val["top1"]
    assert (s["updates"], s["epochs"], s["status"], s["starts"]) == (11, 1, "completed", 2)


# ---- fairseq's text formats: --log-format simple (the default without a TTY) and fairseq <= 0.9 -------------

SIMPLE = FAIRSEQ.with_name("fairseq_translation_simple.sample.txt")  # written by fairseq's own SimpleProgressBar
LEGACY = FAIRSEQ.with_name("fairseq_legacy_0.9.sample.txt")


def test_fairseq_simple_format_gives_the_same_records_as_json():
    simple, as_json = parse_training_file(SIMPLE), parse_training_file(FAIRSEQ)  # the same run, both formats
    assert [(p.kind, p.update, p.loss, p.rate) for p in simple.points] == \
        [(p.kind, p.update, p.loss, p.rate) for p in as_json.points]
    s = summarize_training(simple)
    assert s["throughput"] == pytest.approx(600.0) and s["valid_curve"] == [[6, 10.512, None]] and s["epochs"] == 1


def test_fairseq_legacy_format():
    s = summarize_training(parse_training_file(LEGACY))
    # wall in whole seconds: 120000 w/s for 10 s then 150000 w/s for 30 s, the first interval dropped as warm-up
    assert s["throughput"] == pytest.approx((120000 * 10 + 150000 * 30) / 40) and "wall time" in s["throughput_note"]
    assert s["loss_curve"] == [[10, 15.18], [20, 14.704], [30, 14.011]] and s["valid_curve"] == [[30, 13.412, None]]
    assert s["updates"] == 30


def test_fairseq_0_10_tagged_its_interval_lines_train():
    # verbatim from a published fairseq 0.10 log (facebookresearch/fairseq issue on FusedAdam, 2020-02-28)
    line = ("2020-02-28 16:17:37 | INFO | train | epoch 001:     19 / 3373 loss=14.704, nll_loss=14.68, ppl=26246.1, "
            "wps=33168.8, ups=2.2, wpb=15074.5, bsz=512, num_updates=20, lr=1.8375e-06, gnorm=7.015, clip=100, oom=0, "
            "train_wall=9, wall=24")
    [point] = parse_training_text(line).points
    assert (point.kind, point.update, point.epoch, point.loss, point.rate, point.wall) == \
        ("train_inner", 20, 1.0, 14.704, 33168.8, 24.0)


def test_fairseq_log_without_interval_records_says_to_use_json(tmp_path):
    # --log-format none: fairseq's own lines only
    log = tmp_path / "none.log"
    log.write_text("\n".join(line for line in SIMPLE.read_text().splitlines() if "fairseq" in line) + "\n")
    with pytest.raises(HpcError) as err:
        parse_training_file(log)
    assert err.value.fix == FAIRSEQ_FIX and "train with --log-format json" in FAIRSEQ_FIX
    other = tmp_path / "other.log"
    other.write_text("hello\n")
    with pytest.raises(HpcError) as err:
        parse_training_file(other)
    assert err.value.fix != FAIRSEQ_FIX


@pytest.mark.parametrize("path", [FAIRSEQ, SIMPLE, LEGACY])
def test_a_log_labelled_by_srun_gives_the_same_records(path):
    # the rendered script's srun --label: ` 0: ` on every line of 16 tasks (toolkit.slurm.render), others' too
    text = path.read_text()
    labelled = "".join(f" 0: {line}\n" for line in text.splitlines()) + "15: 2026-01-01 00:00:00 | INFO | rank 15 up\n"
    plain, tagged = parse_training_text(text), parse_training_text(labelled)
    assert [(p.kind, p.update, p.loss, p.rate, p.wall) for p in tagged.points] == \
        [(p.kind, p.update, p.loss, p.rate, p.wall) for p in plain.points] != []


def test_the_rendered_scripts_one_labelled_job_log_is_read_as_rank_0s_lines():
    """The sbatch executor's ranks share one log, each line prefixed by srun --label ("0: ", " 1: "): the training
    records are rank 0's (the other ranks' copies, and the batch shell's own lines, are not its)."""
    record = {"event": "train", "epoch": 0, "interval_images": 64, "interval_seconds": 0.5}
    lines = ["hpc: job 12: 1 nodes x 2 ranks"]
    for step, loss in ((2, 2.3), (4, 2.1)):
        for rank in (0, 1):
            lines.append(f"{rank}: " + json.dumps({**record, "step": step, "loss": loss + rank}))
    log = parse_training_text("\n".join(lines), "ddp_train-12.out")
    assert log is not None and [(p.update, p.loss) for p in log.points] == [(2, 2.3), (4, 2.1)]
