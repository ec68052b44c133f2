"""On the real local Slurm, every submission path runs what its dry run planned: submitit (slurm) and the
rendered script (sbatch) run one rank program with one rank contract, and a sweep's array is what its dry run
showed."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import cli_json, run_hpc, slurm_env, submit_json
from tests.jobhelpers import HOSTILE, probe_recipe, read_ranks, sweep_probe_recipe, write_cluster
from toolkit.job.env import SUBMIT_ENV_ALLOWLIST
from toolkit.job.rank import master_port

pytestmark = pytest.mark.slurm


def dry_and_real(args: list[str], env: dict) -> tuple[dict, dict]:
    res = run_hpc("recipes", "submit", *args, "--dry-run", "--json", env=env)
    assert res.returncode == 0, res.stderr
    dry = cli_json(res)
    assert not os.path.exists(dry["run_dir"]), "a dry run creates nothing"
    real = submit_json(*args, "--wait", env=env)
    assert real["state"] == "COMPLETED", real
    return dry, real


def same_but_run_dir(dry_text: str, real_text: str, dry_run_dir: str, real_run_dir: str) -> None:
    assert dry_run_dir != real_run_dir
    assert dry_text.replace(dry_run_dir, "<RUN>") == real_text.replace(real_run_dir, "<RUN>")


def plan_file(run: Path) -> dict:
    return json.loads((run / "plan.json").read_text())


# Differ between any two processes or are the executor's own bookkeeping, not the job's environment.
PER_PROCESS = re.compile(r"^(SLURM_|SUBMITIT_|_$|PWD$|OLDPWD$|SHLVL$)")
CONTRACT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR")
# What the probe recipe's job sets (its env, the CPU queue's threads, the rendezvous), and what Slurm sets.
# ...and the heartbeat dir the rank program exports (toolkit.workloads.heartbeat)
# PYTHONPATH: the staged node-side code (toolkit.job.staging), never the submitter's
# ...and the fleet's node ledger the batch shell exports (toolkit.node.ledger)
JOB_VARS = {"PROBE_OUT", "PYTHONUNBUFFERED", "OMP_NUM_THREADS", "MASTER_PORT", "HPC_HEARTBEAT_DIR", "PYTHONPATH",
            "HPC_FLEET_DIR", *CONTRACT}
SLURM_MADE = {"ENVIRONMENT", "HOSTNAME", "SLURMD_NODENAME", "SRUN_DEBUG"}


def test_every_executor_kind_runs_the_planned_rank_program_with_one_contract(slurm_sandbox, tmp_path):
    """The one equality test of the submission paths, on the real local Slurm: a recipe submitted through
    submitit (slurm) and as its rendered script (sbatch) runs, on every rank, what its dry run planned: the same
    argv, the same rank contract, the same allow-listed environment and nothing else; and what was written and
    sent (script, parameters, submitit's batch script, the script Slurm stored) is the dry run's, byte for byte
    but the run dir."""
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"),
               AWS_SECRET_ACCESS_KEY="canary-secret-do-not-leak", GITHUB_TOKEN="canary-token-do-not-leak",
               HPC_TEST_MARKER="x")
    args = [str(probe_recipe(tmp_path)), "--cluster", str(write_cluster(tmp_path)), "--queue", "cpu"]
    ranks, runs = {}, {}
    for kind in ("slurm", "sbatch"):
        dry, real = dry_and_real([*args, "--executor", kind], env)
        run = runs[kind] = Path(real["run_dir"])
        meta = json.loads((run / "metadata.json").read_text())
        assert dry["executor"] == real["executor"] == meta["executor"] == kind
        same_but_run_dir(dry["script"], (run / "job.sbatch").read_text(), dry["run_dir"], str(run))
        same_but_run_dir(json.dumps(dry["rank_program"]), json.dumps(plan_file(run)["rank_program"]),
                         dry["run_dir"], str(run))
        if kind == "slurm":
            same_but_run_dir(json.dumps(dry["parameters"]), json.dumps(plan_file(run)["parameters"]),
                             dry["run_dir"], str(run))
            # What sbatch really received: submitit keeps the file it sent as <job id>_submission.sh.
            sent = (run / "submitit" / f"{real['job_id']}_submission.sh").read_text()
            same_but_run_dir(dry["batch_script"], sent, dry["run_dir"], str(run))
        else:  # the script Slurm stored for the job is the dry run's (and so the run dir's job.sbatch, as sent)
            stored = subprocess.run(["scontrol", "write", "batch_script", real["job_id"], "-"], capture_output=True,
                                    text=True, env=env, timeout=60)
            assert stored.returncode == 0, stored.stderr
            same_but_run_dir(dry["script"], stored.stdout, dry["run_dir"], str(run))
            assert not (run / "batch_script.sh").exists()  # no copy of the file sbatch read
        ranks[kind] = read_ranks(tmp_path / "probe")
        assert sorted(ranks[kind]) == [0, 1, 2, 3]
        for rank, seen in ranks[kind].items():
            assert seen["argv"][:2] == ["--text", HOSTILE.format(canary=tmp_path / "canary")]
            assert [seen["env"][name] for name in CONTRACT] == [str(rank), str(rank % 2), "4", "2", str(rank // 2),
                                                                "c1"]
            assert int(seen["env"]["MASTER_PORT"]) == master_port(int(real["job_id"]))
            assert seen["env"]["HPC_HEARTBEAT_DIR"] == f"{run}/heartbeats"  # each run's own
            assert seen["env"]["PYTHONPATH"].split(":")[0].startswith(f"{run}/.hpc/hpc-node-")  # the staged code
            job_env = {k for k in seen["env"] if not PER_PROCESS.match(k)}
            # Nothing of the submitter's but the allow-list (sbatch's --export list makes Slurm add the node's
            # login environment on the sbatch path, never the submitter's).
            assert "HPC_TEST_MARKER" not in job_env and "canary" not in json.dumps(seen["env"])
            if kind == "slurm":
                assert job_env <= set(SUBMIT_ENV_ALLOWLIST) | JOB_VARS | SLURM_MADE, job_env
    for rank in range(4):
        slurm, sent = ranks["slurm"][rank], ranks["sbatch"][rank]
        assert slurm["argv"] == sent["argv"], f"rank {rank}"
        per_run = {"MASTER_PORT", "HPC_HEARTBEAT_DIR", "PYTHONPATH"}  # the job's port, the run dir's files
        shared = (set(SUBMIT_ENV_ALLOWLIST) & set(env)) | (JOB_VARS - per_run)
        assert {k: slurm["env"].get(k) for k in shared} == {k: sent["env"].get(k) for k in shared}, f"rank {rank}"
    assert not (tmp_path / "canary").exists()
    for path in (p for run in runs.values() for p in run.rglob("*")):
        if path.is_file() and path.suffix != ".pkl":
            assert "canary-" not in path.read_text(errors="replace"), path


def test_sweep_dry_run_equals_the_array_submit_sent(slurm_sandbox, tmp_path):
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    args = [str(sweep_probe_recipe(tmp_path)), "--cluster", str(write_cluster(tmp_path)), "--queue", "cpu",
            "--sweep", "args.--count=1,2,3"]
    dry, real = dry_and_real(args, env)
    sweep_dir = Path(real["run_dir"])
    assert dry["tasks"] == real["tasks"] == 3 and dry["kind"] == "sweep"
    same_but_run_dir(json.dumps(dry["parameters"]), json.dumps(plan_file(sweep_dir)["parameters"]),
                     dry["run_dir"], str(sweep_dir))
    same_but_run_dir(dry["script"], (sweep_dir / "task-000" / "job.sbatch").read_text(), dry["run_dir"],
                     str(sweep_dir))
    sent = (sweep_dir / "submitit" / f"{real['job_id']}_submission.sh").read_text()
    assert "#SBATCH --array=0-2%3" in sent
    same_but_run_dir(dry["batch_script"], sent, dry["run_dir"], str(sweep_dir))
    assert [Path(p).name for p in dry["task_run_dirs"]] == ["task-000", "task-001", "task-002"]
