"""nccl-tests parsing over every published format (fixtures are format samples, see their first lines), and the verdict."""

from pathlib import Path

import pytest

from toolkit.errors import HpcError
from toolkit.reports.nccl import judge, parse_file, parse_text, report, summarize
from toolkit.workloads.collectives import Layout, Measure, float_cell, header_lines, row_line

FIXTURES = Path(__file__).parent / "fixtures" / "nccl"


@pytest.mark.parametrize("name,test,rows,keys,ranks,nodes,transport", [
    ("2019_no-root_float-error_mpirun-tagged.sample.txt", "all_reduce", 14, "size count type redop", 16, 2, "efa"),
    ("2019_all-gather_no-redop_unchecked.sample.txt", "all_gather", 8, "size count type", 8, 1, None),
    ("2022_root_wrong_srun-label.sample.txt", "all_reduce", 16, "size count type redop root", 16, 2, "efa"),
    ("v2.17_timestamp-S.sample.txt", "all_reduce", 6, "size count type redop root", 16, 2, None),
    ("v2.18_per-iteration-I1.sample.txt", "all_reduce", 6, "size count type redop root", 16, 2, None),
])
def test_every_text_variant_parses_by_its_header(name, test, rows, keys, ranks, nodes, transport):
    [parsed] = parse_file(FIXTURES / name)
    assert parsed.name == test and len(parsed.rows) == rows
    assert parsed.format.startswith(f"text: {keys} | ")
    assert (parsed.ranks, parsed.nodes, parsed.transport) == (ranks, nodes, transport)
    sizes = [r.size for r in parsed.rows]
    assert sizes == sorted(sizes) and all(r.out_of_place and r.in_place for r in parsed.rows)
    # the footer's average is nccl-tests' mean over both placements of the rows it printed
    measures = [m.busbw_gbs for r in parsed.rows for m in r.measures()]
    assert parsed.avg_busbw_gbs == pytest.approx(sum(measures) / len(measures), rel=1e-3)


def test_old_float_error_column_is_an_error_not_a_count_and_split_row_is_stitched():
    [t] = parse_file(FIXTURES / "2019_no-root_float-error_mpirun-tagged.sample.txt")
    first = t.rows[0]  # printed half, then NCCL INFO lines, then its second half
    assert (first.size, first.count, first.redop, first.root) == (8, 2, "sum", None)
    assert first.out_of_place.time_us == 60.0 and first.in_place.time_us == 59.4
    assert t.rows[1].out_of_place.error == 2e-07 and t.rows[1].out_of_place.wrong is None
    assert summarize(t)["max_error"] == 2e-07 and summarize(t)["wrong_values"] == 0


def test_unchecked_run_has_no_wrong_counts():
    [t] = parse_file(FIXTURES / "2019_all-gather_no-redop_unchecked.sample.txt")
    assert all(m.wrong is None and m.error is None for r in t.rows for m in r.measures())
    assert t.rows[0].redop is None and summarize(t)["wrong_values"] is None


def test_timestamp_and_per_iteration_columns():
    [ts] = parse_file(FIXTURES / "v2.17_timestamp-S.sample.txt")
    assert ts.rows[0].timestamp == "2025-03-04 10:15:10" and ts.rows[0].in_place.wrong == 0
    [pi] = parse_file(FIXTURES / "v2.18_per-iteration-I1.sample.txt")
    row = pi.rows[-1]
    assert set(row.out_of_place.extra) == {"i_min", "i_max", "i_p99", "i_cv%"}
    assert row.out_of_place.extra["i_min"] < row.out_of_place.time_us < row.out_of_place.extra["i_max"]
    assert row.in_place.busbw_gbs == 433.91 and row.out_of_place.busbw_gbs == 438.25


def test_json_output_of_minus_J():
    [t] = parse_file(FIXTURES / "v2.17_json-J.sample.json")
    assert t.name == "all_reduce" and t.format == "json v2" and (t.ranks, t.nodes) == (16, 2)
    assert t.rows[-1].size == 1073741824 and t.rows[-1].root == -1 and t.rows[-1].out_of_place.wrong == 0
    assert summarize(t)["avg_busbw_gbs"] == t.avg_busbw_gbs


def test_three_tests_in_one_file_collapsed_whitespace_and_wrong_values():
    tests = parse_file(FIXTURES / "v2.17_three-tests_collapsed_wrong.sample.txt")
    assert [t.name for t in tests] == ["all_reduce", "all_gather", "reduce_scatter"]
    assert [len(t.rows) for t in tests] == [4, 4, 4]
    assert tests[1].rows[0].redop == "none" and tests[1].rows[0].count * 4 * 4 == tests[1].rows[0].size
    rs = summarize(tests[2])
    assert rs["wrong_values"] == 6 and rs["out_of_bounds"] == 1
    assert judge(tests[2]).status == "FAIL" and judge(tests[0]).status == "NO-VERDICT"


def test_nccl_info_glued_after_root_and_multi_digit_srun_labels():
    text = "\n".join([
        "12: n1:77:77 [0] NCCL INFO Using network Socket",
        *("0: " + line for line in header_lines()),
        "0:      1048576        262144     float     sum      -1n1:77:90 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via NET/Socket/0",
        "1: n2:78:78 [0] NCCL INFO Connected all rings",
        "0:    100.00   10.49   10.49       0    101.00   10.38   10.38       0",
        "0:  2097152  524288  float  sum  -1  200.0  10.49  10.49  0  201.0  10.43  10.43  0",
        "0: # Out of bounds values : 0 OK",
        "0: # Avg bus bandwidth    : 10.4475 ",
    ])
    [t] = parse_text(text)
    assert [r.size for r in t.rows] == [1048576, 2097152]
    assert t.rows[0].root == -1 and t.rows[0].out_of_place.time_us == 100.0 and t.transport == "tcp"


def test_rows_that_do_not_fit_the_header_are_skipped_not_misread():
    text = "\n".join(header_lines() + [
        "        1024           256     float     sum      -1    10.00    0.10    0.10       0    10.00    0.10    0.10       0",
        "        2048           512     float     sum      -1    10.00    0.20    0.20       0    10.00    0.20    0.20       0   EXTRA",
        "     garbage           512     float     sum      -1    10.00    0.20    0.20       0    10.00    0.20    0.20       0",
        "host: Test NCCL failure common.cu:1234 'unhandled system error'",
    ])
    [t] = parse_text(text)
    assert [r.size for r in t.rows] == [1024]


def test_bitwise_columns_of_the_newest_format():
    header = ("#       size         count      type   redop    root     time   algbw   busbw  #wrong  #bitdiff"
              "     time   algbw   busbw  #wrong  #bitdiff")
    row = "     1048576        262144     float     sum      -1    50.00   20.97   39.32       0         0    51.00   20.56   38.55       0         0"
    [t] = parse_text(header + "\n" + row)
    assert t.rows[0].in_place.busbw_gbs == 38.55 and t.rows[0].out_of_place.extra == {"#bitdiff": 0.0}


def test_our_collectives_rows_read_back_exactly():
    lay = Layout(send=262144, recv=262144, count=262144, size=1048576)
    line = row_line(lay, "float", "sum", [Measure(1234.5678, 0.8494, 1.2741, 0), Measure(99.0, 10.59, 15.89, None)])
    [t] = parse_text("\n".join(header_lines() + [line]))
    r = t.rows[0]
    assert (r.size, r.count, r.root, r.out_of_place.time_us, r.out_of_place.busbw_gbs) == (1048576, 262144, -1, 1234.57, 1.27)
    assert r.in_place.wrong is None and r.in_place.algbw_gbs == 10.59


@pytest.mark.parametrize("value,width,text", [
    (0.5, 6, "  0.50"), (1234.5678, 7, "1234.57"), (12345.6, 7, "12345.6"), (107434.0, 7, " 107434"),
    (123456789.0, 7, "1.2e+08"),
])
def test_numbers_are_printed_like_nccl_tests(value, width, text):
    assert float_cell(value, width) == text


@pytest.mark.parametrize("content,message", [
    (None, "no such file"), ("just some text\n", "no nccl-tests results"), ("{not json", "does not parse"),
    ('{"version": 2}', "no 'results' list"),
])
def test_unreadable_inputs_are_clear_errors(tmp_path, content, message):
    path = tmp_path / "log.txt"
    if content is not None:
        path.write_text(content)
    with pytest.raises(HpcError) as err:
        parse_file(path)
    assert message in err.value.message and err.value.fix


def nccl_log(busbw: float, size: int = 1 << 30, network: str = "AWS Libfabric", nodes: int = 2) -> str:
    """An all_reduce_perf log of 8 ranks per node (hosts a, b, c...) whose one row reaches `busbw`."""
    ranks = 8 * nodes
    devices = [f"#  Rank {r:2d} Group  0 Pid {100 + r:6d} on {chr(ord('a') + r // 8):>10s} device {r % 8:2d} [0000:10:00] GPU"
               for r in range(ranks)]
    algbw = busbw / (2 * (ranks - 1) / ranks)  # nccl-tests' all_reduce busbw factor (doc/PERFORMANCE.md)
    row = f"{size:12d}  {size // 4:12d}     float     sum      -1    100.0   {algbw:.2f}   {busbw:.2f}       0    100.0   {algbw:.2f}   {busbw:.2f}       0"
    return "\n".join([f"a:1:1 [0] NCCL INFO Using network {network}", "# Collective test starting: all_reduce_perf",
                      "# Using devices", *devices, *header_lines(), row])


@pytest.mark.parametrize("busbw,status", [(9.5, "PASS"), (3.1, "FAIL")])
def test_verdict_against_the_p3dn_efa_floor(busbw, status):
    [t] = parse_text(nccl_log(busbw))
    verdict = judge(t, "p3dn.24xlarge")
    assert verdict.status == status and verdict.floor_busbw_gbs == 6.0 and verdict.measured_busbw_gbs == busbw
    assert "nccl#235" in verdict.source


def test_tcp_fallback_on_an_efa_instance_is_judged_against_efa_and_named():
    [t] = parse_text(nccl_log(3.1, network="Socket"))
    verdict = judge(t, "p3dn.24xlarge")
    assert verdict.status == "FAIL" and "NCCL used TCP" in verdict.reason
    assert judge(t, "p3dn.24xlarge", transport="tcp").status == "PASS"  # deliberately over TCP: its own floor


def test_no_verdict_cases():
    [t] = parse_text(nccl_log(9.5))
    assert "NVLink only" in judge(t, "p3dn.24xlarge", nodes=1).reason
    assert judge(t, None).status == "NO-VERDICT"
    assert "no published floor" in judge(t, "m5.xlarge").reason
    [small] = parse_text(nccl_log(9.5, size=1 << 20))
    assert "largest message" in judge(small, "p3dn.24xlarge").reason
    with pytest.raises(HpcError):
        judge(t, "p9.mega")


def test_report_combines_files_and_rejects_unknown_transport(tmp_path):
    (tmp_path / "a.log").write_text(nccl_log(9.5))
    (tmp_path / "b.log").write_text(nccl_log(2.0))
    data, tests = report([tmp_path / "a.log", tmp_path / "b.log"], "p3dn.24xlarge")
    assert [t["verdict"]["status"] for t in data["tests"]] == ["PASS", "FAIL"] and data["status"] == "FAIL"
    assert data["tests"][0]["rows"][0]["out_of_place"]["busbw_gbs"] == 9.5 and len(tests) == 2
    with pytest.raises(HpcError) as err:
        report([tmp_path / "a.log"], transport="infiniband")
    assert err.value.exit_code == 2


# ---- logs as published: launcher prefixes, a first `{`, partial pastes, several files -------------------------

def test_ray_skypilot_prefixes_are_stripped_and_counts_come_from_nccl():
    # `(head, rank=0, pid=N) [1,0]<stdout>:` (coloured) and `(worker1, rank=1, pid=N, ip=A) [1,8]<stdout>:` lines
    [t] = parse_file(FIXTURES / "2025_ray-skypilot-prefix_socket.sample.txt")
    assert [r.size for r in t.rows] == [1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30]
    assert t.rows[-1].out_of_place.busbw_gbs == 2.95 and t.avg_busbw_gbs == 2.00833
    assert (t.ranks, t.nodes, t.nccl_nnodes, t.transport) == (16, 2, 2, "tcp") and t.name is None


def test_a_text_log_whose_first_character_is_a_brace_is_read_as_text():
    path = FIXTURES / "2019_brace-first-char_mpirun-tagged.sample.txt"
    assert path.read_text().startswith("{ /opt/amazon/openmpi/bin/mpirun")
    [t] = parse_file(path)
    assert t.name == "all_reduce" and len(t.rows) == 4 and t.rows[-1].in_place.error == 0.0
    assert (t.ranks, t.nodes, t.transport) == (16, 2, "efa")


def test_partial_paste_takes_ranks_from_nccl_nranks_and_never_says_one_node():
    [t] = parse_file(FIXTURES / "2023_partial-paste_nranks-only.sample.txt")
    assert (t.ranks, t.nodes) == (16, None) and len(set(t.hosts)) == 1  # 8 device lines, all on the first node
    assert t.count_note == "8 device line(s) for ranks 0-7 of NCCL's nranks 16: the node count is not in the log"
    verdict = judge(t, "p4d.24xlarge")  # 16 ranks / 8 GPUs per p4d: at least 2 nodes, so the network was measured
    assert verdict.status == "PASS" and "2 nodes (at least, from 16 ranks / 8 GPUs per node)" in verdict.reason
    assert judge(t, "p4d.24xlarge", nodes=1).reason.startswith("one node")  # --nodes still wins


def test_a_device_list_with_a_gap_and_no_nranks_is_an_unknown_count():
    lines = (FIXTURES / "2022_root_wrong_srun-label.sample.txt").read_text().splitlines()
    kept = [line for line in lines if not any(f"Rank {r:2d} Group" in line for r in range(4, 12))]
    [t] = parse_text("\n".join(kept))
    assert (t.ranks, t.nodes) == (None, None)
    assert t.count_note == "8 device line(s) for ranks 0-3, 12-15: the list is incomplete and no NCCL nranks line"
    verdict = judge(t, "p4d.24xlarge")
    assert verdict.status == "NO-VERDICT" and "node count is unknown" in verdict.reason and "--nodes" in verdict.reason
    assert summarize(t)["count_note"] == t.count_note


def test_one_unreadable_file_does_not_hide_the_others(tmp_path):
    (tmp_path / "a.log").write_text(nccl_log(9.5))
    (tmp_path / "empty.log").write_text("srun: error: Unable to create step for job 42\n")
    data, tests = report([tmp_path / "a.log", tmp_path / "missing.log", tmp_path / "empty.log"], "p3dn.24xlarge")
    assert [t["verdict"]["status"] for t in data["tests"]] == ["PASS"] and len(tests) == 1
    assert data["status"] == "FAIL"  # an unreadable file is a failure of the report, whatever the others say
    assert [e["source"] for e in data["errors"]] == [str(tmp_path / "missing.log"), str(tmp_path / "empty.log")]
    assert data["errors"][0]["error"].startswith("no such file") and data["errors"][1]["error"].startswith("no nccl-tests")
    assert all(e["fix"] for e in data["errors"])
    with pytest.raises(HpcError, match="no such file"):  # nothing readable at all: the one error
        report([tmp_path / "missing.log"])


def test_a_log_with_nccl_init_lines_but_no_device_lines():
    # verbatim lines of a published 16-rank MSCCL/nccl-tests example output (mpirun --tag-output)
    text = """\
[1,5]<stdout>:az-eus-v100-32gb-5-worker-zphjiy:18101:18135 [5] NCCL INFO comm 0x7f3804000fa0 rank 5 nranks 16 cudaDev 5 busId 3bfd00000 - Init COMPLETE
[1,0]<stdout>:NCCL version 2.12.12.MSCCL.0.7.3+cuda11.6
[1,0]<stdout>:az-eus-v100-32gb-5-worker-zphjiy:18075:18131 [0] NCCL INFO comm 0x7f26f0000fa0 rank 0 nranks 16 cudaDev 0 busId f6a800000 - Init COMPLETE
[1,0]<stdout>:#
[1,0]<stdout>:#                                                              out-of-place                       in-place
[1,0]<stdout>:#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
[1,0]<stdout>:#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
[1,0]<stdout>:az-eus-v100-32gb-5-worker-zphjiy:18075:18075 [0] NCCL INFO Launch mode Parallel
[1,0]<stdout>:        1024           256     float     sum      -1    75.18    0.01    0.03      0    78.30    0.01    0.02      0
[1,0]<stdout>:        2048           512     float     sum      -1    79.54    0.03    0.05      0    82.56    0.02    0.05      0
"""
    [t] = parse_text(text)
    assert [r.size for r in t.rows] == [1024, 2048] and (t.ranks, t.nodes) == (16, None)
    assert t.count_note == "no device lines ('#  Rank N ... on HOST device D') of NCCL's nranks 16: the node count is not in the log"
    # 16 ranks on 8-GPU p3dn nodes: at least 2 nodes, so the verdict gets past the node count to the sizes
    assert judge(t, "p3dn.24xlarge").reason.startswith("largest message 2048 B is under the floor's")


def test_nccl_lines_of_hosts_whose_names_start_with_a_digit_are_not_rows():
    # the INFO lines are verbatim from NVIDIA/nccl#1597 (hosts 8h200-2, 8h200-3); rows from the SkyPilot README
    text = "\n".join(header_lines() + [
        "        1024            16     float    none      -1    28.39    0.04    0.03      0    28.07    0.04    0.03      0",
        "8h200-2:6831:6840 [0] NCCL INFO Using network Libfabric",
        "8h200-3:6310:6318 [0] NCCL INFO NET/OFI Selected Provider is efa (found 16 nics)",
        "        2048            32     float    none      -1    28.29    0.07    0.07      0    28.24    0.07    0.07      0",
    ])
    [t] = parse_text(text)
    assert [r.size for r in t.rows] == [1024, 2048] and t.transport == "efa"


@pytest.mark.parametrize("instance_type,nodes,busbw,status,floor", [
    ("p4de.24xlarge", 2, 78.3, "PASS", 60.0),  # the published 2-node figure (tree effect)
    ("p4d.24xlarge", 2, 50.0, "FAIL", 60.0),   # at line rate on 2 nodes: the tree did not help, something is off
    ("p4d.24xlarge", 3, 47.0, "PASS", 40.0),   # healthy 3+ nodes reach about the line rate, not the 2-node figure
    ("p4d.24xlarge", 8, 45.0, "PASS", 40.0),
    ("p4d.24xlarge", 4, 12.0, "WARN", 40.0),   # a bad multi-node run (one rail, or TCP-like): the floor is an
                                               # estimate (no published 3+ node run), so it warns
    ("p3dn.24xlarge", 16, 7.0, "PASS", 6.0),   # p3dn's figure is the 8-32 node one: any count
])
def test_the_floor_depends_on_the_node_count(instance_type, nodes, busbw, status, floor):
    [t] = parse_text(nccl_log(busbw, nodes=nodes))
    assert t.nodes == nodes
    verdict = judge(t, instance_type)
    assert (verdict.status, verdict.floor_busbw_gbs) == (status, floor), verdict.reason
    assert f"{nodes} nodes" in verdict.reason


# ---- judged at the largest size run, floors from published runs, estimates warn -------------------------------

P5_SLOW_AT_1GIB = FIXTURES / "2024_2x-p5_slow-at-1GiB_mpirun-tagged.sample.txt"


def test_a_healthy_2x_p5_run_slow_at_1gib_passes_judged_at_its_largest_size():
    # the shape of the published healthy older-stack 2x p5 run: 313 GB/s at 1 GiB, higher at larger sizes
    [t] = parse_file(P5_SLOW_AT_1GIB)
    assert (t.ranks, t.nodes, t.rows[-1].size) == (16, 2, 8 << 30)
    assert [r.out_of_place.busbw_gbs for r in t.rows if r.size == 1 << 30] == [313.29]
    verdict = judge(t, "p5.48xlarge")
    assert (verdict.status, verdict.size_bytes, verdict.measured_busbw_gbs) == ("PASS", 8 << 30, 471.6)
    assert verdict.floor_busbw_gbs == 380.0 and not verdict.estimate  # the floor measured at 8 GiB
    assert "at 8 GiB (the largest size run)" in verdict.reason and "awsome-distributed-training" in verdict.source


def test_a_healthy_2x_p5_run_that_stopped_at_1gib_is_not_failed():
    # the old rule judged every run against 350 GB/s at 1 GiB: this healthy published shape was a FAIL
    text = "\n".join(line for line in P5_SLOW_AT_1GIB.read_text().splitlines()
                     if not any(f" {size}  " in line for size in (1 << 31, 1 << 32, 1 << 33)))
    [t] = parse_text(text)
    assert t.rows[-1].size == 1 << 30
    verdict = judge(t, "p5.48xlarge")
    assert verdict.status == "PASS", verdict.reason
    assert (verdict.status, verdict.size_bytes, verdict.floor_busbw_gbs) == ("PASS", 1 << 30, 250.0)
    assert "at 1 GiB (the largest size run)" in verdict.reason


def test_below_a_measured_floor_at_the_largest_size_fails_even_if_a_smaller_size_was_fast(tmp_path):
    # 437.79 GB/s at 2 GiB clears that size's floor, but the run is judged at 8 GiB, where 300 is under 380
    log = tmp_path / "slow-at-8GiB.log"
    log.write_text(P5_SLOW_AT_1GIB.read_text().replace("471.60", "300.00"))
    data, _ = report([log], "p5.48xlarge")
    [test] = data["tests"]
    assert data["status"] == "FAIL" and test["verdict"]["status"] == "FAIL"
    assert (test["verdict"]["size_bytes"], test["verdict"]["floor_busbw_gbs"]) == (8 << 30, 380.0)
    assert "busbw 300 GB/s at 8 GiB" in test["verdict"]["reason"]


def test_below_an_estimated_floor_warns_and_the_report_says_warn(tmp_path):
    # no published run of 3+ p5 nodes: the floor (80% of the line rate) is an estimate, so below it is WARN
    (tmp_path / "p5x3.log").write_text(nccl_log(200.0, nodes=3))
    data, _ = report([tmp_path / "p5x3.log"], "p5.48xlarge")
    [test] = data["tests"]
    assert data["status"] == "WARN" and test["verdict"]["status"] == "WARN" and test["verdict"]["estimate"]
    assert "estimated floor" in test["verdict"]["reason"] and test["verdict"]["size_bytes"] == 1 << 30
    (tmp_path / "p5x2.log").write_text(nccl_log(200.0, nodes=2))  # a measured floor among them: FAIL wins
    assert report([tmp_path / "p5x3.log", tmp_path / "p5x2.log"], "p5.48xlarge")[0]["status"] == "FAIL"


@pytest.mark.parametrize("largest,floor", [
    (1 << 30, 250.0), ((1 << 30) + (1 << 29), 250.0), (1 << 31, 350.0), (1 << 34, 385.0), (1 << 36, 385.0)])
def test_the_floor_is_the_one_measured_at_the_largest_size_up_to_the_run(largest, floor):
    [t] = parse_text(nccl_log(470.0, size=largest))
    verdict = judge(t, "p5.48xlarge")
    assert (verdict.status, verdict.floor_busbw_gbs, verdict.size_bytes) == ("PASS", floor, largest)
