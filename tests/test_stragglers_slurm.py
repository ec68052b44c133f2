"""A node made slow for real (testbench.faults.slow_node: a CPU quota on node c2's slurmd, inherited by every
step it runs) under our ResNet trainer, 2 nodes x 2 ranks on the local Slurm: `hpc report run` flags c2's two
ranks for their compute, names the node with a drain command, and plots each rank's step by phase (PNG). The
clean run (no limit) that flags nothing: tests/test_training_slurm.py.
"""

from __future__ import annotations


import pytest

from tests.conftest import REPO, cli_envelope, run_hpc, slurm_env, submit_json, wait_until
from tests.test_own_code_slurm import job_gone
from testbench.faults import slow_node
from toolkit.node import ledger
from toolkit.rundir import RunDir

pytestmark = [pytest.mark.slurm, pytest.mark.training]
# The nodes run this checkout's toolkit (the venv's own install may be another checkout's).
# 20 steps: the limit starts after the first step, so a run's first windows are at full speed; with 12 steps (11
# windows) a slowed rank needed 10 over the line and one run of 2 in bench_stragglers had 9 (issue 35).
RESNET = ["resnet50", "--profile", "smoke", "--nodes", "2", "--set", "args.--max-steps=20", "--set",
          "args.--checkpoint-every-steps=0", "--env", f"PYTHONPATH={REPO}", "--env", "HPC_HEARTBEAT_INTERVAL=1"]


def test_a_node_limited_to_0_4_cpu_is_named_with_its_ranks(slurm_sandbox, tmp_path):
    fleet_dir = tmp_path / "fleet"
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"), HPC_FLEET_DIR=str(fleet_dir))
    job = submit_json(*RESNET, env=env, cwd=tmp_path)
    run = RunDir(job["run_dir"])
    # Once every rank trains (start-up at full speed), node c2 and everything on it gets 0.4 of a CPU (its two
    # ranks had about a CPU between them).
    wait_until(lambda: len([b for b in run.heartbeats() if b.step]) == 4, 300, "every rank's first step")
    with slow_node("c2", 0.4):
        wait_until(lambda: job_gone(slurm_sandbox, job["job_id"]), 300, "the job's end")

    plot = tmp_path / "ranks.png"
    flagged = run_hpc("report", "run", str(run.path), "--json", "--plot", "-o", str(plot), env=env)
    assert flagged.returncode == 1, flagged.stdout + flagged.stderr
    found = cli_envelope(flagged)["data"]["stragglers"]
    assert found["note"] is None and min(r["steps"] for r in found["ranks"]) >= 10  # enough steps to judge
    assert [(r["rank"], r["node"], r["cause"]) for r in found["ranks"] if r["slow"]] == [(2, "c2", "compute"),
                                                                                       (3, "c2", "compute")]
    assert found["lines"][-1].startswith("node c2: every rank on it is slow (compute)")
    assert "straggler: rank 2 on node c2" in cli_envelope(flagged)["error"]["message"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The fleet remembers (issue 35): the job's pre-flight passed both nodes, and the report struck c2 in the
    # ledger the job's plan names: one performance strike from this job (the policy suspects at 2).
    assert cli_envelope(flagged)["data"]["fleet_recorded"] == ["c2"]
    strikes = [r for r in ledger.read(fleet_dir) if r.get("verdict") == ledger.FAIL]
    assert [(r["node"], r["source"], r["kind"], r["job"]) for r in strikes] == [("c2", "straggler", "performance",
                                                                                 job["job_id"])]
    assert {r["node"] for r in ledger.read(fleet_dir) if r.get("source") == "preflight"} == {"c1", "c2"}
    # Every rank's step is as long as the slowest's (DDP waits in the all-reduce): the phases tell them apart.
    steps = [r["step_ms"] for r in found["ranks"]]
    assert max(steps) < 1.2 * min(steps)
