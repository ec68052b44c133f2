"""`hpc report nccl --instance dl1.24xlarge`: Gaudi collectives judged against the DL1 post's peer-direct table.

No HPU ran here: the logs are written with the collectives workload's own table code (header, rows, footer,
device lines) for 32 ranks on 4 hosts, at bandwidths chosen near the post's figures.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import cli_json, run_hpc
from toolkit.accelerators.gaudi import DL1_PEER_DIRECT, PEER_DIRECT_MBS
from toolkit.reports.nccl import judge_reference, parse_text
from toolkit.workloads.collectives import Measure, REDOP, bus_factor, footer_lines, header_lines, layout, row_line

MiB = 2**20


def gaudi_log(busbw_mbs: dict[str, float], ranks: int = 32, sizes=(16 * MiB, 32 * MiB, 64 * MiB),
              devices: bool = True) -> str:
    """A collectives log as rank 0 prints it on `ranks` HPUs (8 per host), every size at the given bus bandwidth."""
    lines = [f"# hpc collectives benchmark (nccl-tests table format): torch 2.x, backend hccl, {ranks} ranks"]
    for op, mbs in busbw_mbs.items():
        lines.append(f"# Collective test starting: {op}_perf")
        if devices:
            lines.append("# Using devices")
            lines += ["#  Rank %2d Group  0 Pid %6d on %10s device %2d [0000:00:00] HPU (hccl)"
                      % (r, 1000 + r, f"dl1-{r // 8}", r % 8) for r in range(ranks)]
        lines += header_lines()
        for size in sizes:
            lay = layout(op, size, ranks, 4)
            busbw = mbs / 1000
            algbw = busbw / bus_factor(op, ranks)
            measure = Measure(lay.size / 1e9 / algbw * 1e6, algbw, busbw, 0)
            lines.append(row_line(lay, "float", REDOP[op], [measure, measure]))
        lines += footer_lines(f"{op}_perf", 0, mbs / 1000)
    return "\n".join(lines) + "\n"


def judged(tmp_path, text: str, *extra: str) -> tuple[int, dict]:
    log = tmp_path / "collectives.out"
    log.write_text(text)
    res = run_hpc("report", "nccl", str(log), "--instance", "dl1.24xlarge", "--json", *extra)
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, cli_json(res)


def test_peer_direct_figures_pass(tmp_path):
    code, data = judged(tmp_path, gaudi_log({op: with_pd * 0.97 for op, (_, with_pd) in PEER_DIRECT_MBS.items()}))
    assert code == 0 and data["status"] == "PASS"
    assert [t["test"] for t in data["tests"]] == ["all_reduce", "all_gather", "reduce_scatter"]
    for test in data["tests"]:
        assert test["verdict"]["status"] == "PASS" and "peer-direct in effect" in test["verdict"]["reason"]
        assert test["verdict"]["floor_busbw_gbs"] == PEER_DIRECT_MBS[test["test"]][1] / 1000


def test_without_peer_direct_figures_are_flagged_with_the_fix(tmp_path):
    code, data = judged(tmp_path, gaudi_log({op: without * 1.02 for op, (without, _) in PEER_DIRECT_MBS.items()}))
    assert code == 1 and data["status"] == "FAIL"
    for test in data["tests"]:
        reason = test["verdict"]["reason"]
        assert test["verdict"]["status"] == "FAIL" and "near the without-peer-direct figure" in reason
        assert "FI_EFA_USE_DEVICE_RDMA=1" in reason and "RDMAV_FORK_SAFE=1" in reason and "1.8.0" in reason


def test_all_reduce_figures_in_the_text_report(tmp_path):
    log = tmp_path / "collectives.out"
    log.write_text(gaudi_log({"all_reduce": 12110}))
    res = run_hpc("report", "nccl", str(log), "--instance", "dl1.24xlarge")
    assert res.returncode == 1
    assert "12,110 MB/s at 32 MB vs the post's 21,136 with peer-direct, 12,110 without" in res.stdout


def test_the_midpoint_between_the_figures_decides():
    without, with_pd = PEER_DIRECT_MBS["all_reduce"]
    middle = (without + with_pd) / 2
    below, above = (parse_text(gaudi_log({"all_reduce": middle + d}))[0] for d in (-50, 50))
    assert judge_reference(below, DL1_PEER_DIRECT).status == "FAIL"
    assert judge_reference(above, DL1_PEER_DIRECT).status == "PASS"


@pytest.mark.parametrize("ranks,sizes,reason", [
    (16, (32 * MiB,), "the post measured 32 HPUs (4 nodes); this run has 16 ranks"),
    (32, (8 * MiB, 64 * MiB), "no 33554432 B (32 MB) row"),
])
def test_runs_not_shaped_like_the_post_get_no_verdict(tmp_path, ranks, sizes, reason):
    code, data = judged(tmp_path, gaudi_log({"all_reduce": 21000}, ranks=ranks, sizes=sizes))
    assert code == 0 and data["status"] == "NO-VERDICT" and reason in data["tests"][0]["verdict"]["reason"]


def test_nodes_stand_in_for_a_log_without_device_lines(tmp_path):
    text = gaudi_log({"all_gather": 40000}, devices=False)
    assert judged(tmp_path, text)[1]["status"] == "NO-VERDICT"
    code, data = judged(tmp_path, text, "--nodes", "4")
    assert code == 0 and data["tests"][0]["verdict"]["status"] == "PASS"


def test_wrong_values_fail_whatever_the_bandwidth(tmp_path):
    text = gaudi_log({"reduce_scatter": 17418}).replace("# Out of bounds values : 0 OK",
                                                        "# Out of bounds values : 1 FAILED")
    code, data = judged(tmp_path, text)
    assert code == 1 and "corrupt data" in data["tests"][0]["verdict"]["reason"]


def test_a_dl1_collectives_run_dir_is_judged_against_the_post(tmp_path):
    run = tmp_path / "collectives-run"
    run.mkdir()
    (run / "metadata.json").write_text(json.dumps({"recipe": "collectives", "nodes": 4, "ranks": 32,
                                                   "instance_type": "dl1.24xlarge"}))
    (run / "collectives-7.out").write_text(gaudi_log({"all_reduce": 12500, "all_gather": 40000}))
    res = run_hpc("report", "run", str(run), "--json")
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    verdicts = {t["test"]: t["verdict"] for t in cli_json(res)["nccl"]}
    assert verdicts["all_reduce"]["status"] == "FAIL" and "FI_EFA_USE_DEVICE_RDMA=1" in verdicts["all_reduce"]["reason"]
    assert verdicts["all_gather"]["status"] == "PASS"
