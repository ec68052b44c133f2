"""`hpc report ...` as users run it: tables, --json, exit codes, plots, clear errors."""

import json
from pathlib import Path

import pytest

from tests.conftest import cli_envelope, cli_json, run_hpc
from tests.test_report_scaling import make_run

NCCL = Path(__file__).parent / "fixtures" / "nccl"


def test_nccl_table_and_pass_verdict():
    res = run_hpc("report", "nccl", str(NCCL / "2019_no-root_float-error_mpirun-tagged.sample.txt"),
                  "--instance", "p3dn.24xlarge")
    assert res.returncode == 0, res.stderr
    assert "size(B)" in res.stdout and "536870912" in res.stdout
    assert "verdict: PASS" in res.stdout and "nccl#235" in res.stdout and "overall: PASS" in res.stdout


def test_nccl_below_the_floor_fails_with_exit_1(tmp_path):
    log = tmp_path / "slow.log"
    log.write_text((NCCL / "2022_root_wrong_srun-label.sample.txt").read_text())
    res = run_hpc("report", "nccl", str(log), "--instance", "p5.48xlarge", "--json")
    assert res.returncode == 1
    data = cli_json(res)
    # judged at its largest size, 8 GiB (71.92 GB/s), against the 2x p5 floor measured at 8 GiB
    verdict = data["tests"][0]["verdict"]
    assert data["status"] == "FAIL" and verdict["floor_busbw_gbs"] == 380.0 and verdict["size_bytes"] == 8 << 30


def test_nccl_wrong_values_fail_and_json_lists_every_test():
    res = run_hpc("report", "nccl", str(NCCL / "v2.17_three-tests_collapsed_wrong.sample.txt"),
                  str(NCCL / "v2.17_json-J.sample.json"), "--json")
    assert res.returncode == 1
    data = cli_json(res)
    assert [t["test"] for t in data["tests"]] == ["all_reduce", "all_gather", "reduce_scatter", "all_reduce"]
    assert data["tests"][2]["wrong_values"] == 6 and data["tests"][2]["verdict"]["status"] == "FAIL"
    assert data["tests"][3]["rows"][0]["size"] == 1048576


def test_nccl_one_node_is_no_verdict_and_plot_is_written(tmp_path):
    png = tmp_path / "busbw.png"
    res = run_hpc("report", "nccl", str(NCCL / "2019_all-gather_no-redop_unchecked.sample.txt"),
                  "--instance", "p4d.24xlarge", "--plot", str(png))
    assert res.returncode == 0 and "NO-VERDICT" in res.stdout
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_nccl_missing_file_is_a_clear_error():
    res = run_hpc("report", "nccl", "/no/such/log.txt")
    assert res.returncode == 1 and "error: no such file: /no/such/log.txt" in res.stderr and "fix:" in res.stderr
    assert "Traceback" not in res.stderr
    res = run_hpc("report", "nccl", "/no/such/log.txt", "--json")
    assert cli_envelope(res)["error"]["message"] == "no such file: /no/such/log.txt"


def test_nccl_usage_errors():
    log = str(NCCL / "v2.17_json-J.sample.json")
    assert run_hpc("report", "nccl", log, "--transport", "ib").returncode == 2
    res = run_hpc("report", "nccl", log, "--instance", "p9.mega")
    assert res.returncode == 1 and "p9.mega" in res.stderr
    assert run_hpc("report", "nccl").returncode == 2


def test_report_run_and_scaling_with_json_and_plot(tmp_path):
    runs = [make_run(tmp_path, "n1", 1, 2, 100.0), make_run(tmp_path, "n2", 2, 4, 170.0)]
    res = run_hpc("report", "run", str(runs[0]))
    assert res.returncode == 0 and "throughput: 100.0 images/s" in res.stdout and "warm-up" in res.stdout
    assert "recipe resnet50 (profile smoke), nodes 1, ranks 2, job 123" in res.stdout
    assert "rank 0 exit code 0 on c1" in res.stdout and "trainer: max_steps after 1 start(s)" in res.stdout
    png = tmp_path / "scaling.png"
    res = run_hpc("report", "scaling", str(runs[1]), str(runs[0]), "--plot", str(png))
    assert res.returncode == 0, res.stderr
    assert "efficiency" in res.stdout and "85%" in res.stdout and "1.70x" in res.stdout
    assert png.read_bytes()[:4] == b"\x89PNG"
    data = cli_json(run_hpc("report", "scaling", str(runs[0]), str(runs[1]), "--json"))
    assert data["baseline"] == str(runs[0]) and [r["efficiency"] for r in data["runs"]] == pytest.approx([1.0, 0.85])


def test_report_scaling_of_a_missing_run_dir_is_exit_1(tmp_path):
    res = run_hpc("report", "scaling", str(tmp_path / "nope"))
    assert res.returncode == 1 and "no such run dir" in res.stderr


def test_nccl_one_unreadable_file_is_named_and_the_others_reported(tmp_path):
    res = run_hpc("report", "nccl", str(NCCL / "2023_partial-paste_nranks-only.sample.txt"), str(tmp_path / "gone.log"),
                  "--instance", "p4d.24xlarge")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "verdict: PASS" in res.stdout and "1073741824" in res.stdout and "overall: FAIL" in res.stdout
    assert f"unreadable: {tmp_path / 'gone.log'}: no such file" in res.stdout
    assert f"{tmp_path / 'gone.log'}: no such file" in res.stderr and "fix:" in res.stderr
    data = cli_json(run_hpc("report", "nccl", str(NCCL / "2023_partial-paste_nranks-only.sample.txt"),
                              str(tmp_path / "gone.log"), "--json"))
    assert data["errors"][0]["source"] == str(tmp_path / "gone.log") and len(data["tests"]) == 1


def test_nccl_partial_paste_says_the_node_count_is_unknown():
    res = run_hpc("report", "nccl", str(NCCL / "2023_partial-paste_nranks-only.sample.txt"))
    assert res.returncode == 0, res.stderr
    assert "ranks=16 nodes=?" in res.stdout
    assert "rank/node count: 8 device line(s) for ranks 0-7 of NCCL's nranks 16" in res.stdout


def _collectives_run(tmp_path: Path, log: Path, efa: bool) -> Path:
    """A run dir whose rank 0 stdout is the given nccl-tests log, its metadata's queue fields as the submit plan
    writes them for a p4d queue read from a cluster config with Efa/Enabled as given."""
    from toolkit.cluster.queues import queues_from_config

    queue = queues_from_config({"Scheduling": {"SlurmQueues": [{"Name": "gpu", "ComputeResources": [
        {"Name": "p4d", "InstanceType": "p4d.24xlarge", "MaxCount": 2, "Efa": {"Enabled": efa}}]}]}})["gpu"]
    run = tmp_path / "run"
    (run / "submitit").mkdir(parents=True)
    (run / "metadata.json").write_text(json.dumps({"recipe": "nccl-tests", "queue": queue.name, "nodes": 2, "ranks": 16,
                                                   "instance_type": queue.instance_type, "fabric": queue.fabric,
                                                   "job_ids": ["77"]}))
    (run / "submitit" / "77_0_log.out").write_text(log.read_text())
    return run


def test_report_run_names_an_unnamed_test_and_flags_sockets_on_an_efa_queue(tmp_path):
    run = _collectives_run(tmp_path, NCCL / "2025_ray-skypilot-prefix_socket.sample.txt", efa=True)
    res = run_hpc("report", "run", str(run))
    assert res.returncode == 1, res.stderr
    assert "unknown test: max busbw 2.98 GB/s" in res.stdout and "None:" not in res.stdout
    assert "network: TCP sockets (nc-d87e1263-worker1:4926:4926 [0] NCCL INFO Using network Socket)" in res.stdout
    assert "WARNING: the queue has EFA but NCCL used TCP sockets" in res.stdout and "LD_LIBRARY_PATH" in res.stdout
    data = cli_json(run_hpc("report", "run", str(run), "--json"))
    assert data["transport"]["name"] == "tcp" and data["transport"]["hosts"] == {"nc-d87e1263-worker1": "tcp"}
    assert data["efa_problem"].startswith("the queue has EFA but NCCL used TCP sockets")


def test_report_run_does_not_flag_efa_runs_or_queues_without_efa(tmp_path):
    efa = _collectives_run(tmp_path / "a", NCCL / "2022_root_wrong_srun-label.sample.txt", efa=True)
    res = run_hpc("report", "run", str(efa))
    assert "network: EFA (aws-ofi-nccl)" in res.stdout and "WARNING" not in res.stdout
    tcp_queue = _collectives_run(tmp_path / "b", NCCL / "2025_ray-skypilot-prefix_socket.sample.txt", efa=False)
    res = run_hpc("report", "run", str(tcp_queue))
    assert res.returncode == 0, res.stderr
    assert "network: TCP sockets" in res.stdout and "WARNING" not in res.stdout
    # judged as the TCP queue it is, not by the instance type's EFA
    assert "no published floor for p4d.24xlarge over TCP" in res.stdout


def test_report_run_takes_a_plain_log_file():
    res = run_hpc("report", "run",
                  str(Path(__file__).parent / "fixtures" / "training" / "fairseq_legacy_0.9.sample.txt"))
    assert res.returncode == 0, res.stderr
    assert "(a plain log: no run dir metadata)" in res.stdout and "throughput: 142500.0 words/s" in res.stdout
    res = run_hpc("report", "run", str(NCCL / "2019_brace-first-char_mpirun-tagged.sample.txt"), "--json")
    data = cli_json(res)
    assert data["log_only"] and data["nccl"][0]["test"] == "all_reduce" and data["transport"]["name"] == "efa"


@pytest.mark.parametrize("instance_type,nodes,busbw,exit_code,status", [
    ("p4de.24xlarge", 2, 78.0, 0, "PASS"), ("p4d.24xlarge", 3, 47.0, 0, "PASS"),
    ("p4d.24xlarge", 2, 40.0, 1, "FAIL"),  # under the floor of a published 2-node run
    ("p4d.24xlarge", 4, 20.0, 0, "WARN"),  # under the 3+ node floor, an estimate: warns, exit 0
])
def test_nccl_multi_node_p4d_runs_are_judged_by_their_node_count(tmp_path, instance_type, nodes, busbw, exit_code,
                                                                 status):
    from tests.test_reports_nccl import nccl_log

    log = tmp_path / "nccl.log"
    log.write_text(nccl_log(busbw, nodes=nodes))
    res = run_hpc("report", "nccl", str(log), "--instance", instance_type, "--json")
    assert res.returncode == exit_code, res.stdout + res.stderr
    [test] = cli_json(res)["tests"]
    assert test["nodes"] == nodes and test["verdict"]["measured_busbw_gbs"] == busbw
    assert test["verdict"]["status"] == status and test["verdict"]["estimate"] == (nodes > 2)


def test_nccl_under_an_estimated_floor_is_warn_with_exit_0(tmp_path):
    from tests.test_reports_nccl import nccl_log

    log = tmp_path / "p5x4.log"
    log.write_text(nccl_log(150.0, nodes=4))  # 4 p5 nodes: no published run, the floor is an estimate
    res = run_hpc("report", "nccl", str(log), "--instance", "p5.48xlarge")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "verdict: WARN: busbw 150 GB/s at 1 GiB (the largest size run)" in res.stdout
    assert "overall: WARN" in res.stdout
    res = run_hpc("report", "nccl", str(log), "--instance", "p5.48xlarge", "--json")
    assert res.returncode == 0 and cli_json(res)["status"] == "WARN"


def _drawn(png: Path):
    """The PNG read back: (height, width) and the pixel variance of each half (each half holds one axes)."""
    from matplotlib.image import imread

    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = imread(png)
    half = pixels.shape[0] // 2
    return pixels.shape[:2], float(pixels[:half].var()), float(pixels[half:].var())


def test_report_run_plots_loss_and_throughput_of_a_fairseq_log_beside_it(tmp_path):
    log = tmp_path / "train.log"
    log.write_text((Path(__file__).parent / "fixtures" / "training" / "fairseq_translation.sample.txt").read_text())
    res = run_hpc("report", "run", str(log), "--plot")
    assert res.returncode == 0, res.stderr
    assert f"plot: {tmp_path / 'train.png'}" in res.stderr
    (height, width), top, bottom = _drawn(tmp_path / "train.png")
    assert (height, width) == (660, 880) and top > 0.005 and bottom > 0.005  # both axes drawn, not blank


def test_report_run_plots_our_trainers_log_to_the_file_named(tmp_path):
    from tests.test_training_logs import Attempt, write_trainer_log

    log = write_trainer_log(tmp_path, [Attempt(0, [10.0, 40.0, 80.0, 75.0, 82.0], val_top1=87.5)])
    png = tmp_path / "out" / "curves.png"
    res = run_hpc("report", "run", str(log), "-o", str(png), "--json")  # -o alone plots too
    assert res.returncode == 0, res.stderr
    assert cli_envelope(res)["data"]["training"]["rate_curve"] == [[2, 10.0], [4, 40.0], [6, 80.0], [8, 75.0],
                                                                    [10, 82.0]]
    _, top, bottom = _drawn(png)
    assert top > 0.005 and bottom > 0.005


def test_report_run_plot_failures_say_why_on_stderr(tmp_path):
    run = _collectives_run(tmp_path, NCCL / "2022_root_wrong_srun-label.sample.txt", efa=True)
    res = run_hpc("report", "run", str(run), "--plot")
    assert res.returncode == 1
    assert res.stderr.startswith(f"error: {run}: nothing to plot: no training records and no per-rank step times")
    assert "hpc report nccl" in res.stderr and not list(run.rglob("*.png"))
    log = Path(__file__).parent / "fixtures" / "training" / "fairseq_translation.sample.txt"
    res = run_hpc("report", "run", str(log), "-o", str(tmp_path / "curves.txt"))
    assert res.returncode == 2 and "does not end in .png" in res.stderr and res.stdout == ""  # before the report


def test_a_plot_file_that_exists_is_kept_unless_forced_and_said_before_the_report(tmp_path):
    """`report run -o`, `report nccl --plot` (and every --plot) wrote over an existing file unasked, after printing
    the report; now the file is refused first and --force writes it."""
    log = Path(__file__).parent / "fixtures" / "training" / "fairseq_translation.sample.txt"
    png = tmp_path / "curves.png"
    png.write_bytes(b"the user's own picture")
    res = run_hpc("report", "run", str(log), "-o", str(png))
    assert res.returncode == 1 and res.stdout == "" and f"{png} already exists" in res.stderr
    assert "--force" in res.stderr and png.read_bytes() == b"the user's own picture"
    res = run_hpc("report", "nccl", str(NCCL / "2022_root_wrong_srun-label.sample.txt"), "--plot", str(png))
    assert res.returncode == 1 and res.stdout == "" and png.read_bytes() == b"the user's own picture"
    res = run_hpc("report", "run", str(log), "-o", str(png), "--force")
    assert res.returncode == 0 and _drawn(png)[1] > 0.005


def test_a_run_with_heartbeats_gets_the_ranks_step_times_below_its_curves(tmp_path):
    import dataclasses

    from tests.test_stragglers import beat
    from tests.test_training_logs import Attempt, write_trainer_log
    from toolkit.reports.plots import training_figure
    from toolkit.reports.stragglers import find_stragglers
    from toolkit.reports.training_logs import parse_training_file, summarize_training

    training = summarize_training(parse_training_file(write_trainer_log(tmp_path, [Attempt(0, [10.0, 40.0, 80.0])])))
    ranks = dataclasses.asdict(find_stragglers([beat(0, 0.01, 0.10, 0.20), beat(1, 0.01, 0.11, 0.19),
                                                beat(2, 0.01, 0.19, 0.01), beat(3, 0.01, 0.20, 0.0)]))
    loss, rate, steps = training_figure(training, ranks).axes
    assert [line.get_label() for line in loss.get_lines()] == ["train"]
    assert list(rate.get_lines()[0].get_xdata()) == [2, 4, 6] and rate.get_ylabel() == "throughput (images/s)"
    assert steps.get_ylabel() == "median ms per step" and len(steps.patches) >= 4 * 3  # phases stacked per rank
    assert len(training_figure(training, None).axes) == 2


def test_a_log_given_where_a_run_dir_or_nccl_output_belongs_is_named(tmp_path):
    """`report nccl` on a training log said it "looks like JSON but does not parse"; `report scaling` on logs said
    to add ranks to "its metadata.json", which a log has not."""
    from tests.test_training_logs import Attempt, write_trainer_log

    log = write_trainer_log(tmp_path, [Attempt(0, [10.0, 40.0, 80.0])])
    res = run_hpc("report", "nccl", str(log))
    assert res.returncode == 1 and f"{log} is a training log (JSON lines of events), not nccl-tests output" in \
        res.stderr and f"hpc report run {log}" in res.stderr
    text_log = Path(__file__).parent / "fixtures" / "training" / "fairseq_translation.sample.txt"
    res = run_hpc("report", "scaling", str(text_log), str(text_log))
    assert res.returncode == 1 and "pass the run dirs" in res.stderr, res.stderr
