"""Planning anywhere (issue 31): with a cluster config given, a plan is for that cluster's Slurm even on a machine
with none (a laptop): it exits 0 with the plan and says once what it could not ask a live Slurm. Submitting is
the one step that needs Slurm here. Each test runs `hpc` as a process whose PATH truly lacks Slurm's commands."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.conftest import REPO, cli_json, run_hpc_process

P5 = REPO / "cluster-configs" / "p5-reservation.yaml"  # p5.48xlarge, 8 GPUs per node, MaxCount 4
OFF_CLUSTER = "no Slurm is installed here"
# Slurm's client commands (Debian's slurm-client, ParallelCluster's /opt/slurm/bin)
SLURM_COMMANDS = {"sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol", "scrontab",
                  "sdiag", "sinfo", "sprio", "squeue", "sreport", "srun", "sshare", "sstat", "strigger", "sview"}


@pytest.fixture(scope="module")
def no_slurm(tmp_path_factory) -> dict[str, str]:
    """An environment without Slurm: PATH is one dir of links to this PATH's programs, less Slurm's commands
    (Slurm may be installed in /usr/bin itself, as on the test machine); no SLURM_CONF, no cluster config."""
    if os.access("/opt/slurm/bin/sbatch", os.X_OK):
        pytest.skip("ParallelCluster's /opt/slurm/bin is found whatever PATH says (toolkit.slurm.commands.find)")
    bin_dir = tmp_path_factory.mktemp("no-slurm") / "bin"
    bin_dir.mkdir()
    for directory in reversed(os.environ["PATH"].split(os.pathsep)):  # the first on PATH wins, as for a shell
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            if entry.name not in SLURM_COMMANDS and os.access(entry.path, os.X_OK):
                link = bin_dir / entry.name
                link.unlink(missing_ok=True)
                link.symlink_to(entry.path)
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_CONF", "HPC_CLUSTER_CONFIG")
           and not k.startswith("SLURM_")}
    env["PATH"] = str(bin_dir)
    env["HPC_RUNS_DIR"] = str(tmp_path_factory.mktemp("runs"))
    assert shutil.which("srun", path=env["PATH"]) is None and shutil.which("sbatch", path=env["PATH"]) is None
    return env


def _ok(res) -> None:
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr


def test_a_plan_for_a_given_cluster_is_for_its_slurm_where_none_is_installed(no_slurm, tmp_path):
    """`hpc run` said "2 nodes x 8 GPUs" and "submitit's local executor, on this machine" in one breath."""
    (tmp_path / "train.py").write_text("print('trained')\n")
    res = run_hpc_process("run", "train.py", "--cluster", str(P5), "--nodes", "2", "--dry-run", env=no_slurm,
                          cwd=tmp_path)
    _ok(res)
    assert "2 nodes x 8 GPUs (p5.48xlarge)" in res.stdout
    assert "sbatch, the rendered script" in res.stdout and "local executor" not in res.stdout + res.stderr
    assert res.stderr.count(OFF_CLUSTER) == 1 and "submitting needs Slurm" in res.stderr
    res = run_hpc_process("recipes", "submit", "resnet50", "--cluster", str(P5), "--nodes", "2", "--dry-run",
                          "--json", env=no_slurm)
    _ok(res)
    plan = cli_json(res)
    assert plan["executor"] == "sbatch" and plan["nodes"] == 2 and "#SBATCH --nodes=2" in plan["script"]
    assert sum(OFF_CLUSTER in note for note in plan["notes"]) == 1
    res = run_hpc_process("recipes", "submit", "resnet50", "--cluster", str(P5), "--nodes", "2", "--executor",
                          "slurm", "--dry-run", "--json", env=no_slurm)
    _ok(res)
    plan = cli_json(res)
    # submitit's own batch script, made without srun (its SlurmExecutor refuses to be made without one)
    assert "#SBATCH --nodes=2" in plan["batch_script"] and "srun --unbuffered" in plan["batch_script"]


def test_a_sweep_plans_where_no_slurm_is_installed(no_slurm):
    """Was exit 1, `internal error: RuntimeError: Could not detect "srun"` (or exit 2: the local executor has no
    job arrays)."""
    res = run_hpc_process("recipes", "submit", "resnet50", "--profile", "smoke", "--cluster", str(P5),
                          "--sweep", "scaling.--lr.base=0.1,0.2", "--dry-run", "--json", env=no_slurm)
    _ok(res)
    plan = cli_json(res)
    assert plan["executor"] == "slurm" and plan["tasks"] == 2
    assert "#SBATCH --array=0-1" in plan["batch_script"]
    assert plan["max_array_size"] == 1001 and "p5-reservation.yaml" in plan["max_array_size_source"]
    assert res.stderr.count(OFF_CLUSTER) == 1


def test_render_show_and_k8s_render_need_no_slurm(no_slurm):
    # resnet50, not a fairseq recipe: fairseq's parser, which checks a fairseq recipe's flags, is no part of planning
    # without Slurm, and loading it took 8-38 s a process here (torch and fairseq imported)
    for args in (["recipes", "render", "resnet50"], ["recipes", "show", "resnet50"]):
        res = run_hpc_process(*args, "--cluster", str(P5), "--nodes", "2", env=no_slurm)
        _ok(res)
        assert "p5.48xlarge" in res.stdout
    res = run_hpc_process("k8s", "render", "resnet50", "--nodes", "2", "--instance", "p5.48xlarge", env=no_slurm)
    _ok(res)
    assert "kind: TrainJob" in res.stdout


def test_the_cluster_config_of_the_environment_counts_as_given(no_slurm):
    res = run_hpc_process("recipes", "submit", "resnet50", "--profile", "smoke", "--dry-run", "--json",
                          env={**no_slurm, "HPC_CLUSTER_CONFIG": str(P5)})
    _ok(res)
    assert cli_json(res)["executor"] == "sbatch"
    # no cluster at all: this machine is the one node (the local executor), as before
    res = run_hpc_process("recipes", "submit", "resnet50", "--profile", "smoke", "--nodes", "1", "--dry-run",
                          "--json", env=no_slurm)
    _ok(res)
    assert cli_json(res)["executor"] == "local" and OFF_CLUSTER in res.stderr
    # and a plan for more nodes than this one machine is refused as its submit would be (it was shown, exit 0)
    res = run_hpc_process("recipes", "submit", "resnet50", "--profile", "smoke", "--nodes", "2", "--dry-run",
                          env=no_slurm)
    assert res.returncode == 2 and "the local executor runs on this one machine; 2 nodes" in res.stderr
    assert "--cluster FILE" in res.stderr


def test_submitting_without_slurm_fails_with_one_line_and_leaves_nothing(no_slurm, tmp_path):
    runs = tmp_path / "runs"
    for sweep in ([], ["--sweep", "scaling.--lr.base=0.1,0.2"]):
        res = run_hpc_process("recipes", "submit", "resnet50", "--profile", "smoke", "--cluster", str(P5), *sweep,
                              env={**no_slurm, "HPC_RUNS_DIR": str(runs)})
        assert res.returncode == 1, res.stdout + res.stderr
        errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "submitting needs Slurm" in errors[0], res.stderr
        assert "Traceback" not in res.stderr
        assert not runs.exists() or not list(runs.iterdir()), "nothing is written for a job not submitted"
