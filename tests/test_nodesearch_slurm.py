"""`hpc cluster find-bad-nodes` on four of the local Slurm's `wide` nodes (w5-w8), with a node made bad for real: w6
loses the file system the toolkit and the job's venv (--venv, the python the ranks run) live on
(testbench.faults.missing_mount, in w6's own mount namespace), so every collective it joins fails. The search names
w6 alone within ceil(log2 4) + 2 rounds, its concurrent groups on disjoint nodes, draws the per-node plot, and
--apply drains w6 with the measurement as the reason (four nodes, not eight: every healthy group of a round imports
torch on these 2 shared cores, and the search on more nodes is the unit tests' and benchmarks'). A
slow node (a CPU limit on its slurmd) and clean runs: benchmarks/bench_nodesearch.py. A --venv without torch:
every node is named for it ("torch does not import on w1: ..."), none unresolved, none drained."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, cli_envelope, run_hpc, slurm_env
from testbench.faults import missing_mount

pytestmark = [pytest.mark.slurm]


def test_a_failing_node_is_found_in_a_few_rounds_and_drained_with_apply(slurm_sandbox, tmp_path):
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    plot = tmp_path / "nodes.png"
    try:
        venv = Path(sys.prefix)
        with missing_mount("w6", REPO), (contextlib.nullcontext() if venv.is_relative_to(REPO)
                                          else missing_mount("w6", venv)):
            # --threshold 0.8: a failing node's runs give no bandwidth at all; healthy pairs on these 2 shared cores
            # differ by up to 2.5x, which the default (half the best) could take for a slow node, and drain it
            res = run_hpc("cluster", "find-bad-nodes", "-p", "wide", "--nodelist", "w[5-8]", "--size", "256K",
                          "--iters", "5", "--threshold", "0.8", "--venv", sys.prefix, "--plot", str(plot), "--apply",
                          "--json", env=env)
        assert res.returncode == 1, res.stdout + res.stderr
        envelope = cli_envelope(res)
        data = envelope["data"]
        assert envelope["error"]["message"] == "bad node(s): w6"
        assert list(data["bad"]) == ["w6"] and data["unresolved"] == []
        why = data["bad"]["w6"]
        assert why.startswith("the collective failed: ") and "No such file or directory" in why
        assert 2 <= len(data["rounds"]) <= data["goal_rounds"] == 4 and data["all_pairs"] == 6
        for entry in data["rounds"]:  # every group of a round ran at once, each node in one group
            members = [n for g in entry["groups"] for n in g["nodes"]]
            assert len(members) == len(set(members))
        healthy = [r for r in data["per_node"] if r["node"] != "w6"]
        assert all(r["verdict"] == "ok" and r["busbw"] > 0 for r in healthy)
        assert data["applied"] and data["drain_plan"][0].startswith("scontrol update NodeName=w6 State=DRAIN")
        assert plot.stat().st_size > 0
        shown = subprocess.run(["sinfo", "-h", "-n", "w6", "-o", "%T %E"], capture_output=True, text=True,
                               env=env, timeout=60).stdout
        assert shown.startswith("drained") and "hpc find-bad-nodes: the collective failed" in shown
        assert "round 1: 2 group(s) at once" in res.stderr  # progress, one line per round
    finally:  # every node --apply may have drained, not only w6: later tests need all eight
        drained = subprocess.run(["sinfo", "-h", "-N", "-n", "w[1-8]", "-t", "drain,drained,draining", "-o", "%N"],
                                 capture_output=True, text=True, env=env, timeout=60).stdout.split()
        for node in drained:
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], env=env, capture_output=True,
                           timeout=60)


def test_nodes_whose_venv_has_no_torch_are_named_so_not_unresolved(slurm_sandbox, tmp_path):
    """--venv: a venv made by the system's python3 -m venv, without torch (every node sees tmp_path here)."""
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    venv = tmp_path / "bare-venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    res = run_hpc("cluster", "find-bad-nodes", "-p", "wide", "--nodelist", "w[1-4]", "--size", "64K", "--iters", "2",
                  "--venv", str(venv), "--apply", "--json", env=env)
    assert res.returncode == 1, res.stdout + res.stderr
    envelope = cli_envelope(res)
    data = envelope["data"]
    assert sorted(data["software"]) == ["w1", "w2", "w3", "w4"]
    assert data["bad"] == {} and data["unresolved"] == [] and data["drain_plan"] == [] and len(data["rounds"]) == 1
    assert data["software"]["w3"].startswith("torch does not import on w3: ModuleNotFoundError: No module named "
                                             "'torch' (python " + str(venv / "bin" / "python"))
    assert envelope["error"]["message"].startswith("torch does not import on w1: ") and "3 more node(s)" in \
        envelope["error"]["message"]
    assert all(r["verdict"] == "software" for r in data["per_node"])
    assert "--venv" in data["software_fix"]
