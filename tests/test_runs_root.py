"""Where run dirs go by default (toolkit.submit.runsroot): the cluster config's FSx before the head node's home,
sweeps of checkpoints refused on home; and two smaller job-side rules of the same issue: the pre-flight's helper
job goes to the cluster's smallest queue, and a ParallelCluster config never gets --requeue=expedite."""

from __future__ import annotations

import copy
import getpass
import os
from pathlib import Path

import pytest
import yaml

from tests.jobhelpers import CLUSTER_CONFIG, write_cluster
from toolkit import rundir
from toolkit.cluster.queues import HELPER_PARTITION_ENV, queues_from_config
from toolkit.errors import HpcError
from toolkit.submit import plan as plans, runsroot, sweep
from toolkit.submit.plan import SubmitRequest


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """No $HPC_RUNS_DIR (conftest sets one for every test) and a home of the test's own."""
    monkeypatch.delenv("HPC_RUNS_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _config_without_fsx(directory: Path) -> Path:
    config = copy.deepcopy(CLUSTER_CONFIG)
    del config["SharedStorage"]
    path = directory / "no-fsx.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _smoke(cluster: Path | None, *overrides: str) -> SubmitRequest:
    """roberta's smoke profile: a requeued training job whose checkpoints are in its run dir."""
    return SubmitRequest("roberta", profile="smoke", cluster=str(cluster) if cluster else None,
                         queue="cpu" if cluster else None, executor="slurm", overrides=overrides)


def test_a_run_dir_defaults_to_the_cluster_configs_fsx_per_user(home, tmp_path):
    p = plans.plan(_smoke(write_cluster(tmp_path)))
    assert p.run_dir.parent == Path("/shared/hpc-runs") / getpass.getuser()  # CLUSTER_CONFIG's FsxLustre mount
    assert not [w for w in p.warnings if "root volume" in w]


def test_without_fsx_it_is_home_with_one_warning_for_a_checkpointing_job(home, tmp_path):
    p = plans.plan(_smoke(_config_without_fsx(tmp_path)))
    assert p.run_dir.parent == home / "hpc-runs"
    [warning] = [w for w in p.warnings if "root volume" in w]
    assert "HPC_RUNS_DIR" in warning and str(p.run_dir) in warning
    # a job without checkpoints in its run dir (a benchmark) gets none
    bench = plans.plan(SubmitRequest("collectives", cluster=str(_config_without_fsx(tmp_path)), queue="cpu"))
    assert not [w for w in bench.warnings if "root volume" in w]


def test_the_default_queue_only_assumes_an_fsx_so_home_it_is(home):
    p = plans.plan(_smoke(None))  # no cluster config: default_queue(), whose /fsx nobody has seen
    assert p.run_dir.parent == home / "hpc-runs"


def test_an_explicit_runs_dir_or_run_dir_wins(home, tmp_path, monkeypatch):
    cluster = write_cluster(tmp_path)
    assert plans.plan(_smoke(cluster), tmp_path / "mine").run_dir == tmp_path / "mine"
    monkeypatch.setenv("HPC_RUNS_DIR", str(tmp_path / "runs"))
    assert plans.plan(_smoke(cluster)).run_dir.parent == tmp_path / "runs"
    # (the smoke job's venv, this test's, is outside either config's shared file systems: warned apart)
    def runs_warnings(config):
        return [w for w in plans.plan(_smoke(config)).warnings if "shared file systems" not in w]

    assert runs_warnings(_config_without_fsx(tmp_path)) == runs_warnings(cluster)


def test_a_checkpointing_sweep_is_refused_on_home_and_goes_to_fsx_or_hpc_runs_dir(home, tmp_path, monkeypatch):
    points = ["args.--weight-decay=0.0,0.01,0.1"]
    with pytest.raises(HpcError) as err:
        sweep.plan(_smoke(_config_without_fsx(tmp_path)), points)
    assert "3 points' checkpoints" in err.value.message and "head node's root volume" in err.value.message
    assert "HPC_RUNS_DIR" in err.value.fix and "FSx" in err.value.fix
    assert not (home / "hpc-runs").exists()
    on_fsx = sweep.plan(_smoke(write_cluster(tmp_path)), points)
    assert on_fsx.sweep_dir.parent == Path("/shared/hpc-runs") / getpass.getuser()
    monkeypatch.setenv("HPC_RUNS_DIR", str(home / "big-disk"))  # explicit: the user's call
    assert sweep.plan(_smoke(_config_without_fsx(tmp_path)), points).sweep_dir.parent == home / "big-disk"


def test_a_one_point_checkpointing_sweep_on_home_is_warned_and_a_benchmark_sweep_is_not(home, tmp_path):
    one = sweep.plan(_smoke(_config_without_fsx(tmp_path)), ["args.--weight-decay=0.01"])
    assert [w for w in one.to_json()["warnings"] if "root volume" in w]
    # checkpoints kept elsewhere (an absolute dir per point): nothing heavy on home
    elsewhere = sweep.plan(_smoke(_config_without_fsx(tmp_path)), ["dirs.checkpoints.dir=/big/a,/big/b"])
    assert not [w for w in elsewhere.to_json()["warnings"] if "root volume" in w]


def test_readers_look_in_this_clusters_fsx_root_and_in_home(home, tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_CLUSTER_CONFIG", str(write_cluster(tmp_path)))
    assert runsroot.reader_roots() == [Path("/shared/hpc-runs") / getpass.getuser(), home / "hpc-runs"]
    monkeypatch.setenv("HPC_RUNS_DIR", str(tmp_path / "runs"))
    assert runsroot.reader_roots() == [tmp_path / "runs"]
    a, b = tmp_path / "r1" / "a", tmp_path / "r2" / "b"
    for run in (a, b):
        rundir.RunDir(run).create().write_metadata(rundir.Metadata(job_ids=[run.name]))
    assert [r.path for r in rundir.list_runs([a.parent, b.parent])] == [a, b]
    assert rundir.find_run("b", [a.parent, b.parent]).path == b


# -- the pre-flight's helper job: the cluster's smallest queue --------------------------------------------------

GPU_FIRST = {"Scheduling": {"Scheduler": "slurm", "SlurmQueues": [
    {"Name": "p5", "ComputeResources": [{"Name": "p5", "InstanceType": "p5.48xlarge", "MaxCount": 4,
                                         "Efa": {"Enabled": True}}]},
    {"Name": "big-cpu", "ComputeResources": [{"Name": "m5", "InstanceType": "m5.xlarge", "MaxCount": 2}]},
    {"Name": "tiny", "ComputeResources": [{"Name": "c5", "InstanceType": "c5.large", "MaxCount": 2}]},
    {"Name": "mystery", "ComputeResources": [{"Name": "x", "InstanceType": "zz9.nano", "MaxCount": 2}]},
]}}


def test_the_helper_partition_is_the_smallest_cpu_queue_never_a_gpu_one():
    queues = queues_from_config(GPU_FIRST)
    assert {q.helper_partition for q in queues.values()} == {"tiny"}  # c5.large: 2 vCPUs, no GPU
    gpu_only = {"Scheduling": {"SlurmQueues": GPU_FIRST["Scheduling"]["SlurmQueues"][:1]}}
    assert queues_from_config(gpu_only)["p5"].helper_partition == "p5"  # nothing smaller: its own


def test_the_helper_partition_can_be_set_and_a_wrong_one_is_refused(monkeypatch):
    monkeypatch.setenv(HELPER_PARTITION_ENV, "big-cpu")
    assert queues_from_config(GPU_FIRST)["p5"].helper_partition == "big-cpu"
    monkeypatch.setenv(HELPER_PARTITION_ENV, "nope")
    with pytest.raises(HpcError, match="HPC_HELPER_PARTITION=nope is not a queue"):
        queues_from_config(GPU_FIRST)


def test_the_preflight_of_a_requeued_job_is_told_the_helper_partition(tmp_path):
    from toolkit.slurm.materialize import build_job_spec
    from toolkit.recipes.load import load_recipe

    p5 = queues_from_config(GPU_FIRST)["p5"]
    spec = build_job_spec(load_recipe("resnet50"), p5, 1, run_dir=str(tmp_path))
    args = list(spec.slurm.preflight_args)
    assert args[args.index("--helper-partition") + 1] == "tiny"


def test_the_node_side_sends_the_helper_to_the_helper_partition(tmp_path, monkeypatch):
    """requeue_excluding with stub sbatch/scontrol (they log their argv): the helper's --partition is the one
    the plan chose, not the job's own."""
    from toolkit.node import preflight

    log = tmp_path / "argv.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, out in (("sbatch", "99"), ("scontrol", "")):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\necho {out}\n')
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_PARTITION", "p5")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    assert preflight.requeue_excluding("41", ["n2"], "tiny").startswith("requeued, excluding n2")
    [sbatch] = [line for line in log.read_text().splitlines() if line.startswith("sbatch ")]
    assert "--partition=tiny" in sbatch.split() and "--partition=p5" not in sbatch.split()


# -- --requeue=expedite: never on a ParallelCluster config ------------------------------------------------------

def test_a_cluster_config_never_gets_an_expedited_requeue(tmp_path, monkeypatch):
    monkeypatch.setattr("toolkit.slurm.version.expedited_requeue", lambda: True)  # a 25.11+ Slurm that allows it
    _, _, spec, _, _ = plans.plan_job(_smoke(write_cluster(tmp_path)), tmp_path / "run")
    assert spec.requeue and not spec.slurm.expedited_requeue
    _, _, spec, _, _ = plans.plan_job(_smoke(None), tmp_path / "run")  # self-managed Slurm: no cluster config
    assert spec.slurm.expedited_requeue


def test_without_a_home_the_runs_need_hpc_runs_dir_and_say_so(tmp_path, monkeypatch):
    """No $HOME and a uid without a passwd entry (a container's arbitrary uid): pathlib raises RuntimeError, which
    reached the user as an internal error."""
    from tests.conftest import run_hpc

    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv(rundir.RUNS_DIR_ENV, raising=False)
    monkeypatch.setattr("pwd.getpwuid", lambda uid: (_ for _ in ()).throw(KeyError(uid)))
    with pytest.raises(RuntimeError):
        Path.home()
    for args in (["recipes", "submit", "resnet50", "--profile", "smoke", "--nodes", "1", "--dry-run"],
                 ["jobs", "list"]):
        res = run_hpc(*args)
        assert res.returncode == 1 and "internal error" not in res.stderr, res.stderr
        assert "there is no home directory here for the runs (~/hpc-runs)" in res.stderr
        assert f"set {rundir.RUNS_DIR_ENV} to a directory for the run dirs" in res.stderr
    # this cluster's FSx is still read; and with HPC_RUNS_DIR the plan is made
    monkeypatch.setenv("HPC_CLUSTER_CONFIG", str(write_cluster(tmp_path)))
    for name in ("USER", "LOGNAME", "LNAME", "USERNAME"):  # and no user name: the uid names the FSx dir
        monkeypatch.delenv(name, raising=False)
    assert runsroot.reader_roots() == [Path("/shared/hpc-runs") / str(os.getuid())]
    monkeypatch.setenv(rundir.RUNS_DIR_ENV, str(tmp_path / "runs"))
    res = run_hpc("--debug", "recipes", "submit", "resnet50", "--profile", "smoke", "--nodes", "1", "--dry-run")
    assert res.returncode == 0, res.stderr
