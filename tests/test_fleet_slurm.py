"""The fleet remembers, on the local Slurm (toolkit.node.ledger, toolkit.health.fleet): node w2 of the `wide`
partition fails a job's pre-flight for real (its shared file system gone: testbench.faults.missing_mount), another
job's straggler finding strikes it again (through ledger.record_finding, the call the straggler report makes), the
quarantine policy then suspects it, and the next job leaves it out with no flag (--exclude in its plan, and it
runs elsewhere). A job that keeps the suspects (--no-avoid-suspects) lands on w2, whose fresh pre-flight passes
and clears it."""

from __future__ import annotations

import pytest

from tests.conftest import REPO, cli_json, run_hpc, slurm_env
from testbench.faults import missing_mount
from toolkit.node import ledger
from toolkit.rundir import RunDir

pytestmark = [pytest.mark.slurm]
PRINT_ENV = REPO / "tests" / "payloads" / "print_env.py"


def test_a_node_struck_by_two_jobs_is_avoided_by_the_next_and_a_fresh_preflight_clears_it(slurm_sandbox, tmp_path):
    where = tmp_path / "fleet"
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"), HPC_FLEET_DIR=str(where))
    job = ("run", str(PRINT_ENV), "--nodes", "2", "--queue", "wide", "--time", "5")
    with missing_mount("w2", tmp_path):  # w1 and w2: the partition's first idle nodes
        first = run_hpc(*job, "--wait", "--json", env=env, cwd=tmp_path)
    assert first.returncode == 0 and cli_json(first)["requeues"] == 1, first.stdout + first.stderr
    first_id = cli_json(first)["job_id"]
    strikes = [r for r in ledger.read(where) if r["verdict"] == "fail"]
    assert [(r["node"], r["job"], r["check"], r["kind"]) for r in strikes] == [("w2", first_id, "shared-fs",
                                                                               "hardware")]
    assert {r["node"] for r in ledger.read(where) if r["verdict"] == "pass"} >= {"w1"}

    assert ledger.record_finding("w2", "straggler", "compute", ledger.PERFORMANCE,
                                 "ranks 2-3 on w2: compute 1.8x the other ranks'", job="4242", fleet=where)
    shown = run_hpc("cluster", "nodes", "--json", env=env)
    assert shown.returncode == 1
    w2 = next(n for n in cli_json(shown)["nodes"] if n["node"] == "w2")
    assert w2["suspect"] and w2["strikes"] == 2 and w2["slurm_state"] == "idle"

    plan = cli_json(run_hpc(*job, "--dry-run", "--json", env=env, cwd=tmp_path))
    assert "\n#SBATCH --exclude=w2\n" in plan["script"]
    second = run_hpc(*job, "--wait", "--json", env=env, cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    ran_on = RunDir(cli_json(second)["run_dir"]).preflights()[-1]["nodes"]
    assert len(ran_on) == 2 and "w2" not in ran_on

    third = run_hpc(*job, "--no-avoid-suspects", "--wait", "--json", env=env, cwd=tmp_path)
    assert third.returncode == 0, third.stdout + third.stderr
    assert "w2" in RunDir(cli_json(third)["run_dir"]).preflights()[-1]["nodes"]
    after = run_hpc("cluster", "nodes", "--json", env=env)
    assert after.returncode == 0 and cli_json(after)["suspects"] == {}
    assert "--exclude" not in cli_json(run_hpc(*job, "--dry-run", "--json", env=env, cwd=tmp_path))["script"]
