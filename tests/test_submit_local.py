"""The local executor (no Slurm): the same per-rank callables on this machine, with an explicit environment."""

from __future__ import annotations


from tests.conftest import cli_json, run_hpc
from tests.jobhelpers import HOSTILE, probe_recipe, read_ranks, write_cluster
from toolkit.job.rank import master_port
from toolkit.slurm import executors


def test_local_executor_runs_each_rank_with_only_the_jobs_environment(tmp_path, monkeypatch):
    # rank 1 ends 3 s after rank 0: --wait must wait for the whole job, not rank 0's result alone
    recipe, cluster = probe_recipe(tmp_path, PROBE_SLOW_RANK="1"), write_cluster(tmp_path)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "canary-secret-do-not-leak")
    monkeypatch.setenv("HPC_TEST_MARKER", "x")
    res = run_hpc("recipes", "submit", str(recipe), "--nodes", "1", "--cluster", str(cluster), "--queue", "cpu",
                  "--executor", "local", "--wait", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    result = cli_json(res)
    assert result["state"] == "COMPLETED" and result["executor"] == "local"
    ranks = read_ranks(tmp_path / "probe")
    assert sorted(ranks) == [0, 1]  # the cpu queue declares 2 ranks per node
    for rank, record in ranks.items():
        env = record["env"]
        assert record["argv"][:2] == ["--text", HOSTILE.format(canary=tmp_path / "canary")]
        assert (env["SLURM_PROCID"], env["SLURM_NTASKS"], env["MASTER_ADDR"]) == (str(rank), "2", "127.0.0.1")
        assert env["MASTER_PORT"] == str(master_port(int(result["job_id"])))
        assert env["OMP_NUM_THREADS"] == "1"
        assert "AWS_SECRET_ACCESS_KEY" not in env and "HPC_TEST_MARKER" not in env
    assert not (tmp_path / "canary").exists()


def test_local_executor_refuses_more_than_one_node(tmp_path):
    recipe, cluster = probe_recipe(tmp_path), write_cluster(tmp_path)
    res = run_hpc("recipes", "submit", str(recipe), "--nodes", "2", "--cluster", str(cluster), "--queue", "cpu",
                  "--executor", "local", cwd=tmp_path)
    assert res.returncode == 2  # a usage error, and the dry run says it too (it showed the plan, exit 0)
    assert "local executor" in res.stderr and "--nodes 1" in res.stderr and "Traceback" not in res.stderr
    dry = run_hpc("recipes", "submit", str(recipe), "--nodes", "2", "--cluster", str(cluster), "--queue", "cpu",
                  "--executor", "local", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 2 and "2 nodes were asked for" in dry.stderr
    assert not list((tmp_path / "runs").glob("*")), "no run dir is left for a job that was not submitted"


def test_local_is_chosen_only_where_no_slurm_is_installed(tmp_path, monkeypatch):
    monkeypatch.setattr("toolkit.slurm.commands.PCLUSTER_SLURM_BIN", tmp_path)
    monkeypatch.setattr("shutil.which", lambda _program: None)
    kind, note = executors.choose_executor(None)
    assert kind == "local" and "no Slurm is installed" in note
    (tmp_path / "sbatch").write_text("#!/bin/sh\n")
    (tmp_path / "sbatch").chmod(0o755)  # ParallelCluster's /opt/slurm/bin counts as installed
    assert executors.choose_executor(None) == ("sbatch", None)  # a single job: its rendered script
    assert executors.choose_executor(None, array=True) == ("slurm", None)  # a sweep: submitit's job array
    assert executors.choose_executor("local") == ("local", None)
