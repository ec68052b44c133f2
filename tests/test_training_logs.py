"""Training logs: fairseq JSON lines (tagged and --log-file) and the ResNet trainer's JSON lines."""

import json
from pathlib import Path

import pytest

from toolkit.errors import HpcError
from toolkit.reports.training_logs import parse_training_file, parse_training_text, summarize_training, throughput

FAIRSEQ = Path(__file__).parent / "fixtures" / "training" / "fairseq_translation.sample.txt"


def test_fairseq_stdout_kinds_values_and_warm_up_excluded():
    log = parse_training_file(FAIRSEQ)
    assert log.format == "fairseq" and log.unit == "words/s" and log.loss_base == "2"
    assert [p.kind for p in log.points] == ["train_inner"] * 3 + ["valid", "train"]
    s = summarize_training(log)
    # the first interval (wps "0") is warm-up; then 1000 w/s for 2 s and 400 w/s for 4 s -> 3600 words / 6 s
    assert s["throughput"] == pytest.approx(600.0) and "excluded" in s["throughput_note"]
    assert s["updates"] == 6 and s["final_loss"] == 11.003 and s["epochs"] == 1
    assert s["loss_curve"] == [[2, 13.912], [4, 12.104], [6, 11.003]] and s["valid_curve"] == [[6, 10.512]]


def test_fairseq_log_file_is_bare_json_and_gives_the_same_records():
    bare = "\n".join(line.split(" | ", 3)[3] for line in FAIRSEQ.read_text().splitlines() if "{" in line)
    tagged, untagged = parse_training_file(FAIRSEQ), parse_training_text(bare)
    assert [(p.kind, p.update, p.loss) for p in untagged.points] == [(p.kind, p.update, p.loss) for p in tagged.points]


def _resnet_lines(rates, start=0.0, seconds_per_step=1.0, world_size=2):
    lines, elapsed = [], start
    for step, rate in enumerate(rates, 1):
        elapsed += seconds_per_step
        lines.append(json.dumps({"step": step, "epoch": 0, "loss": 2.0 / step, "lr": 0.1, "images_per_sec": rate,
                                 "world_size": world_size, "elapsed": elapsed}))
    lines.append(json.dumps({"kind": "summary", "step": len(rates), "images_per_sec": sum(rates) / len(rates),
                             "world_size": world_size}))
    return "\n".join(["some startup text", *lines])


def test_resnet_trainer_lines_with_summary():
    log = parse_training_text(_resnet_lines([5.0, 40.0, 44.0]))
    s = summarize_training(log)
    assert (log.format, s["unit"], s["loss_base"], s["updates"]) == ("resnet", "images/s", "e", 3)
    assert s["throughput"] == pytest.approx(42.0) and s["trainer_summary"]["kind"] == "summary"
    assert s["loss_curve"][0] == [1, 2.0]


def test_too_few_records_use_everything_and_say_so():
    log = parse_training_text(_resnet_lines([30.0]))
    value, note = throughput(log)
    assert value == 30.0 and "too few" in note


def test_intervals_without_a_clock_fall_back_to_the_plain_mean():
    lines = [json.dumps({"step": i, "images_per_sec": r}) for i, r in enumerate([1.0, 10.0, 20.0], 1)]
    value, note = throughput(parse_training_text("\n".join(lines)))
    assert value == 15.0 and "plain mean" in note


def test_a_file_without_records_is_a_clear_error(tmp_path):
    (tmp_path / "x.log").write_text("nothing here\n{\"unrelated\": 1}\n")
    with pytest.raises(HpcError) as err:
        parse_training_file(tmp_path / "x.log")
    assert "no training records" in err.value.message
