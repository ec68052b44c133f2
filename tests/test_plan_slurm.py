"""`--dry-run --json` is what `submit` writes and runs, on the real local Slurm: the same script, the same executor
parameters and the same batch script submitit hands to sbatch (same bytes but the run dir), for a submitit
recipe, an MPI recipe (sbatch) and a sweep (one job array)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import run_hpc, slurm_env, submit_json
from tests.jobhelpers import probe_recipe, sweep_probe_recipe, write_cluster

pytestmark = pytest.mark.slurm


def dry_and_real(args: list[str], env: dict) -> tuple[dict, dict]:
    res = run_hpc("recipes", "submit", *args, "--dry-run", "--json", env=env)
    assert res.returncode == 0, res.stderr
    dry = json.loads(res.stdout)
    assert not os.path.exists(dry["run_dir"]), "a dry run creates nothing"
    real = submit_json(*args, "--wait", env=env)
    assert real["state"] == "COMPLETED", real
    return dry, real


def same_but_run_dir(dry_text: str, real_text: str, dry_run_dir: str, real_run_dir: str) -> None:
    assert dry_run_dir != real_run_dir
    assert dry_text.replace(dry_run_dir, "<RUN>") == real_text.replace(real_run_dir, "<RUN>")


def plan_file(run: Path) -> dict:
    return json.loads((run / "plan.json").read_text())


def test_submitit_recipe_dry_run_equals_what_submit_wrote_and_sbatch_got(slurm_sandbox, tmp_path):
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    args = [str(probe_recipe(tmp_path)), "--cluster", str(write_cluster(tmp_path)), "--queue", "cpu"]
    dry, real = dry_and_real(args, env)
    run = Path(real["run_dir"])
    assert dry["executor"] == real["executor"] == "submitit-slurm"
    same_but_run_dir(dry["script"], (run / "job.sbatch").read_text(), dry["run_dir"], str(run))
    written = plan_file(run)
    same_but_run_dir(json.dumps(dry["parameters"]), json.dumps(written["parameters"]), dry["run_dir"], str(run))
    # What sbatch really received: submitit keeps the file it sent as <job id>_submission.sh.
    sent = (run / "submitit" / f"{real['job_id']}_submission.sh").read_text()
    same_but_run_dir(dry["batch_script"], sent, dry["run_dir"], str(run))


def test_mpi_recipe_dry_run_equals_the_script_sbatch_ran(slurm_sandbox, tmp_path):
    """The sbatch path: what Slurm stored for the job is the dry run's script. (The local Slurm has no PMIx
    library, so the MPI step itself cannot start here: the job is cancelled once Slurm has it.)"""
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    args = [str(probe_recipe(tmp_path)), "--cluster", str(write_cluster(tmp_path)), "--queue", "cpu",
            "--set", "launcher.mpi=pmix", "--set", "resources.time=00:01:00"]
    res = run_hpc("recipes", "submit", *args, "--dry-run", "--json", env=env)
    assert res.returncode == 0, res.stderr
    dry = json.loads(res.stdout)
    real = submit_json(*args, env=env)
    try:
        run = Path(real["run_dir"])
        assert dry["executor"] == real["executor"] == "sbatch" and real["job_id"].isdigit()
        same_but_run_dir(json.dumps(dry["argv"]), json.dumps(plan_file(run)["argv"]), dry["run_dir"], str(run))
        same_but_run_dir(dry["script"], (run / "job.sbatch").read_text(), dry["run_dir"], str(run))
        # The batch script Slurm stored for the job (scontrol write batch_script) is the script itself.
        same_but_run_dir(dry["script"], (run / "batch_script.sh").read_text(), dry["run_dir"], str(run))
    finally:
        run_hpc("jobs", "cancel", real["job_id"], env=env)


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
