"""The collectives benchmark: nccl-tests' size and bandwidth conventions, and a real 2-rank gloo run read back."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli_json, REPO, free_port, run_hpc
from toolkit.errors import HpcError
from toolkit.reports.nccl import parse_text
from toolkit.workloads.collectives import bandwidths, bus_factor, layout, parse_size, sizes


@pytest.mark.parametrize("op,n,expected", [("all_reduce", 8, 1.75), ("all_gather", 8, 0.875),
                                           ("reduce_scatter", 4, 0.75), ("all_reduce", 2, 1.0)])
def test_bus_factors_are_nccl_tests(op, n, expected):
    assert bus_factor(op, n) == expected


def test_size_conventions_follow_nccl_tests():
    # all_gather: each rank sends count/n elements; the size column is the gathered (receive) buffer
    assert layout("all_gather", 1000, 3, 4) == layout("all_gather", 996, 3, 4)
    lay = layout("all_gather", 1000, 3, 4)
    assert (lay.send, lay.recv, lay.count, lay.size) == (83, 249, 83, 996)
    lay = layout("reduce_scatter", 1000, 3, 4)
    assert (lay.send, lay.recv, lay.count, lay.size) == (249, 83, 83, 996)
    lay = layout("all_reduce", 1000, 3, 4)
    assert (lay.send, lay.recv, lay.count, lay.size) == (250, 250, 250, 1000)
    algbw, busbw = bandwidths("all_reduce", 1_000_000, 0.001, 4)
    assert algbw == pytest.approx(1.0) and busbw == pytest.approx(1.5)


def test_sizes_and_size_syntax():
    assert parse_size("4M") == 4 << 20 and parse_size("8") == 8 and parse_size("1.5K") == 1536
    assert sizes(8, 64, 2) == [8, 16, 32, 64] and sizes(100, 300, 1, 100) == [100, 200, 300]
    with pytest.raises(HpcError):
        parse_size("lots")
    with pytest.raises(HpcError):
        sizes(64, 8)



@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory) -> Path:
    """A real run: 2 gloo ranks on 127.0.0.1; rank 0's stdout saved as a log."""
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "toolkit.workloads.collectives", "--ops", "all_reduce,all_gather,reduce_scatter",
             "-b", "8", "-e", "256K", "-f", "4", "-n", "5", "-w", "2"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO))
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    assert outs[1][0] == ""  # only rank 0 prints
    log = tmp_path_factory.mktemp("collectives") / "rank0.out"
    log.write_text(outs[0][0])
    return log


@pytest.mark.training
def test_real_gloo_run_is_read_by_the_nccl_parser(gloo_run):
    tests = parse_text(gloo_run.read_text())
    assert [t.name for t in tests] == ["all_reduce", "all_gather", "reduce_scatter"]
    for t in tests:
        assert [r.size for r in t.rows] == [8 * 4 ** k for k in range(8)] and (t.ranks, t.nodes) == (2, 1)
        assert t.out_of_bounds == 0
        for row in t.rows:
            for m in row.measures():
                assert m.wrong == 0 and m.time_us > 0
                assert m.busbw_gbs == pytest.approx(m.algbw_gbs * bus_factor(t.name, 2), abs=0.011)


@pytest.mark.training
def test_report_cli_on_the_real_run(gloo_run):
    res = run_hpc("report", "nccl", str(gloo_run), "--json")
    assert res.returncode == 0, res.stderr
    data = cli_json(res)
    assert data["status"] == "NO-VERDICT" and len(data["tests"]) == 3
    assert all(t["wrong_values"] == 0 and t["max_busbw_gbs"] > 0 for t in data["tests"])


@pytest.mark.training
def test_device_flags_the_job_spec_sets_are_accepted_and_a_mismatch_is_refused(capsys):
    """toolkit.job.spec gives every python-module workload --device/--backend/--threads; nccl needs cuda."""
    from toolkit.workloads.collectives import main

    assert main(["--device", "cpu", "--backend", "nccl", "--threads", "1"]) == 1
    err = capsys.readouterr().err
    assert "--backend nccl does not run on --device cpu" in err and "fix:" in err
