"""`hpc recipes submit` on the real local Slurm: the submitit path against the rendered script, rank by rank."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_hpc, slurm_env
from tests.jobhelpers import HOSTILE, probe_recipe, read_ranks
from toolkit.job.env import SUBMIT_ENV_ALLOWLIST
from toolkit.job.rank import master_port
from toolkit.job.spec import time_minutes

pytestmark = pytest.mark.slurm
# Differ between any two processes or are the executor's own bookkeeping, not the job's environment.
PER_PROCESS = re.compile(r"^(SLURM_|SUBMITIT_|_$|PWD$|OLDPWD$|SHLVL$)")
# What the probe recipe's job sets (its env, the CPU queue's threads, the rendezvous), and what Slurm sets.
JOB_VARS = {"PROBE_OUT", "PYTHONUNBUFFERED", "OMP_NUM_THREADS", "MASTER_ADDR"}
SLURM_MADE = {"ENVIRONMENT", "HOSTNAME", "SLURMD_NODENAME", "SRUN_DEBUG"}


def job_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not PER_PROCESS.match(k)}


def sbatch_options(script: str) -> dict[str, str]:
    options = {}
    for line in script.splitlines():
        m = re.match(r"#SBATCH --([a-z-]+)(?:[= ](.*))?$", line.strip())
        if m:
            options[m.group(1)] = (m.group(2) or "").strip()
    return options


def test_submit_and_render_give_every_rank_the_same_command_and_environment(slurm_sandbox, tmp_path):
    recipe = probe_recipe(tmp_path)
    env = dict(slurm_env(slurm_sandbox), AWS_SECRET_ACCESS_KEY="canary-secret-do-not-leak",
               GITHUB_TOKEN="canary-token-do-not-leak", HPC_TEST_MARKER="x", HPC_RUNS_DIR=str(tmp_path / "runs"))

    # The rendered script, sent with plain sbatch.
    script = tmp_path / "job.sbatch"
    res = run_hpc("recipes", "render", str(recipe), "--nodes", "2", "-o", str(script), env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (tmp_path / "runs" / "probe").mkdir(parents=True)
    sent = subprocess.run(["sbatch", "--parsable", "--wait", str(script)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    assert sent.returncode == 0, sent.stderr
    rendered_job = int(sent.stdout.strip().split(";")[0])
    rendered = read_ranks(tmp_path / "probe")

    # The same recipe through submitit.
    res = run_hpc("recipes", "submit", str(recipe), "--nodes", "2", "--wait", "--json", env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    assert result["state"] == "COMPLETED"
    submitted = read_ranks(tmp_path / "probe")

    assert sorted(rendered) == sorted(submitted) == [0, 1, 2, 3]
    for rank in range(4):
        r, s = rendered[rank], submitted[rank]
        assert r["argv"] == s["argv"], f"rank {rank}"
        assert r["argv"][:2] == ["--text", HOSTILE.format(canary=tmp_path / "canary")]
        assert int(r["env"]["MASTER_PORT"]) == master_port(rendered_job)
        assert int(s["env"]["MASTER_PORT"]) == master_port(int(result["job_id"]))
        r_env, s_env = job_env(r["env"]), job_env(s["env"])
        # The job's own variables and the allow-listed submitter ones are the same both ways.
        shared = (set(SUBMIT_ENV_ALLOWLIST) & set(env)) | JOB_VARS
        assert {k: r_env.get(k) for k in shared} == {k: s_env.get(k) for k in shared}, f"rank {rank}"
        for name in set(SUBMIT_ENV_ALLOWLIST) & set(env):  # allow-listed submitter variables arrive as they were
            assert s_env[name] == env[name], name
        # submit: nothing else at all (sbatch runs in a clean environment with --export=ALL); render: the
        # --export=LIST form makes Slurm add the node's login environment, never the submitter's.
        assert set(s_env) <= set(SUBMIT_ENV_ALLOWLIST) | JOB_VARS | {"MASTER_PORT"} | SLURM_MADE, set(s_env)
        assert "canary" not in json.dumps(r["env"]) + json.dumps(s["env"])
        assert "HPC_TEST_MARKER" not in r_env and "HPC_TEST_MARKER" not in s_env
        assert r["env"]["MASTER_ADDR"] == "c1"
    assert not (tmp_path / "canary").exists()

    # The batch script Slurm stored asks for the same resources as the rendered one.
    run = Path(result["run_dir"])
    stored, ours = sbatch_options((run / "batch_script.sh").read_text()), sbatch_options(script.read_text())
    for key in ("partition", "nodes", "ntasks-per-node", "cpus-per-task", "exclusive", "wait-all-nodes"):
        assert stored.get(key) == ours.get(key), key
    assert time_minutes(stored["time"]) == time_minutes(ours["time"])
    assert (stored["export"], ours["export"]) == ("ALL", ",".join(SUBMIT_ENV_ALLOWLIST))
    meta = json.loads((run / "metadata.json").read_text())
    assert meta["job_ids"] == [result["job_id"]] and meta["ranks"] == 4 and meta["toolkit_version"]
    assert yaml.safe_load((run / "recipe.yaml").read_text())["name"] == "probe"
    for path in run.rglob("*"):
        if path.is_file() and path.suffix != ".pkl":
            assert "canary-" not in path.read_text(errors="replace"), path


def test_a_failing_rank_ends_wait_non_zero_and_names_its_log(slurm_sandbox, tmp_path):
    recipe = probe_recipe(tmp_path, PROBE_FAIL_RANK="3")
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    res = run_hpc("recipes", "submit", str(recipe), "--nodes", "2", "--wait", env=env, cwd=tmp_path)
    assert res.returncode == 1
    assert "Traceback" not in res.stderr
    log = re.search(r"see (\S+_3_log\.err)", res.stderr)
    assert log, res.stderr
    assert "failing on purpose" in Path(log.group(1)).read_text()
    job_id = res.stdout.split()[0]
    status = run_hpc("jobs", "status", job_id, "--json", env=env)
    assert status.returncode == 1 and json.loads(status.stdout)["state"] == "FAILED"


def test_jobs_commands_on_a_finished_run(slurm_sandbox, tmp_path):
    recipe = probe_recipe(tmp_path)
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    res = run_hpc("recipes", "submit", str(recipe), "--nodes", "2", "--wait", "--json", env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    listed = json.loads(run_hpc("jobs", "list", "--json", env=env).stdout)
    assert [(r["job_id"], r["state"], r["recipe"]) for r in listed] == [(job_id, "COMPLETED", "probe")]
    logs = run_hpc("jobs", "logs", job_id, "--rank", "2", env=env)
    assert logs.returncode == 0 and "probe rank 2 on c2" in logs.stdout
    missing = run_hpc("jobs", "logs", job_id, "--rank", "9", env=env)
    assert missing.returncode == 1 and "rank 9" in missing.stderr and "Traceback" not in missing.stderr
    unknown = run_hpc("jobs", "status", "999999", env=env)
    assert unknown.returncode == 1 and "999999" in unknown.stderr


def test_sacct_less_status_falls_back_to_squeue_scontrol_and_the_run_dir(slurm_sandbox, tmp_path, monkeypatch):
    """ParallelCluster ships without accounting: with sacct failing, status still comes out right."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "sacct").write_text("#!/bin/sh\necho 'sacct: error: Slurm accounting storage is disabled' >&2\n"
                                    "exit 1\n")
    (fake_bin / "sacct").chmod(0o755)
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    env["PATH"] = f"{fake_bin}:{env['PATH']}"
    recipe = probe_recipe(tmp_path)
    res = run_hpc("recipes", "submit", str(recipe), "--nodes", "2", "--wait", "--json", env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    status = json.loads(run_hpc("jobs", "status", job_id, "--json", env=env).stdout)
    assert status["state"] == "COMPLETED" and status["source"] in ("squeue", "scontrol")
    # Once Slurm has forgotten the job (MinJobAge), the run dir still knows how it ended.
    from toolkit.submit import runs

    monkeypatch.setenv("HPC_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr("toolkit.slurm.status.query", lambda ids: {})
    assert runs.status(job_id).state == "COMPLETED" and runs.status(job_id).source == "run-dir"
