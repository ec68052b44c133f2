"""`hpc report ...` as users run it: tables, --json, exit codes, plots, clear errors."""

import json
from pathlib import Path

import pytest

from tests.conftest import run_hpc
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
    data = json.loads(res.stdout)
    assert data["status"] == "FAIL" and data["tests"][0]["verdict"]["floor_busbw_gbs"] == 350.0


def test_nccl_wrong_values_fail_and_json_lists_every_test():
    res = run_hpc("report", "nccl", str(NCCL / "v2.17_three-tests_collapsed_wrong.sample.txt"),
                  str(NCCL / "v2.17_json-J.sample.json"), "--json")
    assert res.returncode == 1
    data = json.loads(res.stdout)
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
    assert json.loads(res.stdout)["ok"] is False


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
    data = json.loads(run_hpc("report", "scaling", str(runs[0]), str(runs[1]), "--json").stdout)
    assert data["baseline"] == str(runs[0]) and [r["efficiency"] for r in data["runs"]] == pytest.approx([1.0, 0.85])


def test_report_scaling_of_a_missing_run_dir_is_exit_1(tmp_path):
    res = run_hpc("report", "scaling", str(tmp_path / "nope"))
    assert res.returncode == 1 and "no such run dir" in res.stderr
