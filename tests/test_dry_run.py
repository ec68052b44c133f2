"""`--dry-run` for people: a short summary of the plan (toolkit.submit.summary), the scripts with --verbose, both
with --json; a sweep's array-size limit from the target cluster (toolkit.submit.sweep.array_limit)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
import yaml

from tests.conftest import cli_json, run_hpc
from tests.jobhelpers import CLUSTER_CONFIG, sweep_probe_recipe, write_cluster
from toolkit.catalog import instance
from toolkit.cluster import queues
from toolkit.cluster.queues import CLUSTER_CONFIG_ENV, load_queues
from toolkit.errors import HpcError
from toolkit.job.rank import preview_argv
from toolkit.slurm.materialize import build_job_spec
from toolkit.recipes.load import load_recipe
from toolkit.submit import summary, sweep
from toolkit.submit.plan import SubmitRequest

P4D = "p4d.24xlarge"


def gpu_cluster(tmp_path: Path, **slurm_settings) -> Path:
    """A config whose first queue is a p4d queue (then the tests' cpu queue), with optional SlurmSettings."""
    config = yaml.safe_load(yaml.safe_dump(CLUSTER_CONFIG))
    config["Scheduling"]["SlurmQueues"].insert(0, {"Name": "gpu", "ComputeResources": [
        {"Name": "p4d", "InstanceType": P4D, "MaxCount": 4, "Efa": {"Enabled": True}}]})
    if slurm_settings:
        config["Scheduling"]["SlurmSettings"] = slurm_settings
    path = tmp_path / "gpu-cluster.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def environ(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, CLUSTER_CONFIG_ENV: "", "HPC_RUNS_DIR": str(tmp_path / "runs")}


def dry_run(tmp_path: Path, *args: str, script_args: tuple[str, ...] = ()):
    res = run_hpc(*args, "--executor", "slurm", "--dry-run", *(("--", *script_args) if script_args else ()),
                  env=environ(tmp_path), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    return res


def test_a_two_node_resnet50_dry_run_is_its_plan_in_a_screenful(tmp_path):
    cluster = gpu_cluster(tmp_path)
    res = dry_run(tmp_path, "recipes", "submit", "resnet50", "--nodes", "2", "--cluster", str(cluster))
    lines = res.stdout.splitlines()
    run_dir = next(line for line in lines if line.startswith("run dir:")).split()[-1]
    assert Path(run_dir).parent == tmp_path / "runs" and not Path(run_dir).exists()
    # What the summary must say, from the recipe, the catalog and the job spec (not from the summary code).
    recipe, gpus = load_recipe("resnet50"), instance(P4D).gpus
    spec = build_job_spec(recipe, load_queues(cluster)["gpu"], 2, run_dir=run_dir)
    env = [f"{v.name}={shlex.quote(v.value)}" + (f":${v.name}" if v.prepend else "") for v in spec.env]
    assert lines == [
        f"{recipe.name}: 2 nodes x {gpus} GPUs ({P4D}), {2 * gpus} ranks ({gpus} per node)",
        "queue:       gpu, the config's first queue (ParallelCluster's default partition)",
        f"cluster:     {cluster}, from --cluster; --cluster FILE picks another",
        f"time limit:  {recipe.resources.time}",
        "submit with: submitit, to Slurm",  # dry_run() asks for --executor slurm
        f"run dir:     {run_dir}",
        f"environment: {env[0]}", *(f"             {line}" for line in env[1:]),
        f"rank 0 runs: {shlex.join(preview_argv(spec.command))}",
        summary.VERBOSE_HINT,
    ]
    assert len(lines) <= 15 and "#SBATCH" not in res.stdout


def test_verbose_adds_the_scripts_and_json_carries_the_summary_and_the_scripts(tmp_path):
    args = ("recipes", "submit", "resnet50", "--nodes", "2", "--cluster", str(gpu_cluster(tmp_path)))
    short = dry_run(tmp_path, *args).stdout.splitlines()
    full = dry_run(tmp_path, *args, "--verbose").stdout
    assert full.splitlines()[0] == short[0] and "script (job.sbatch):" in full and "#SBATCH --nodes=2" in full
    assert "batch script submitit sends to sbatch:" in full and summary.VERBOSE_HINT not in full
    data = cli_json(dry_run(tmp_path, *args, "--json"))
    assert data["script"].startswith("#!/bin/bash") and data["batch_script"] and data["parameters"]["nodes"] == 2
    facts = data["summary"]
    assert (facts["nodes"], facts["device"], facts["devices_per_node"], facts["ranks"]) == (2, "gpu", 8, 16)
    assert facts["queue"] == {"name": "gpu", "source": "the config's first queue (ParallelCluster's default partition)"}
    assert facts["run_dir"] == data["run_dir"] and facts["rank0_argv"] == data["rank0_argv"]


def test_where_the_cluster_config_and_the_queue_came_from(tmp_path, monkeypatch):
    own = write_cluster(tmp_path)
    monkeypatch.setattr(queues, "HEAD_NODE_CONFIG", tmp_path / "head-node" / "cluster-config.yaml")
    monkeypatch.delenv(CLUSTER_CONFIG_ENV, raising=False)
    request = SubmitRequest("resnet50")
    config, source = summary.cluster_source(request)
    assert config is None and source.startswith("the built-in default (one p3dn.24xlarge queue): no --cluster")
    assert str(queues.HEAD_NODE_CONFIG) in source and summary.queue_source(request, config) == \
        "the built-in default queue"
    queues.HEAD_NODE_CONFIG.parent.mkdir()
    queues.HEAD_NODE_CONFIG.write_text(own.read_text())
    assert summary.cluster_source(request) == (str(queues.HEAD_NODE_CONFIG), "this cluster's own config "
                                               "(ParallelCluster's copy on the head node)")
    monkeypatch.setenv(CLUSTER_CONFIG_ENV, str(own))  # the environment wins over the head node's copy
    assert summary.cluster_source(request) == (str(own), f"${CLUSTER_CONFIG_ENV}")
    given = SubmitRequest("resnet50", cluster=str(tmp_path / "other.yaml"), queue="cpu")
    assert summary.cluster_source(given) == (given.cluster, "--cluster")
    assert summary.queue_source(given, given.cluster) == "from --queue"
    # The same through the CLI: the environment's config and its first queue.
    res = run_hpc("run", "json.tool", "--executor", "slurm", "--dry-run", env={**environ(tmp_path),
                                                                               CLUSTER_CONFIG_ENV: str(own)})
    assert res.returncode == 0, res.stderr
    assert f"cluster:     {own}, from ${CLUSTER_CONFIG_ENV}; --cluster FILE picks another" in res.stdout.splitlines()


def test_secret_values_are_never_shown_and_the_toolkits_own_code_is_named(tmp_path):
    res = dry_run(tmp_path, "run", "json.tool", "--cluster", str(write_cluster(tmp_path)), "--queue", "cpu",
                  "--nodes", "2", "--launcher", "torchrun", "--env", "HF_TOKEN=s3cret-1", "--env",
                  "TOKENIZERS_PARALLELISM=false", script_args=("--sort-keys",))
    lines = res.stdout.splitlines()
    assert "s3cret-1" not in res.stdout and "             HF_TOKEN=<hidden>" in lines
    assert "             TOKENIZERS_PARALLELISM=false" in lines
    assert lines[0] == "tool: 2 nodes x 4 CPUs (m5.xlarge), 4 ranks (2 per node, one torchrun per node starts them)"
    rank0 = next(line for line in lines if line.startswith("rank 0 runs: "))
    assert rank0.startswith("rank 0 runs: python -c <torchrun> --nnodes 2 --nproc-per-node 2 ")
    assert rank0.endswith(" --no-python python -c <toolkit/job/user_main.py> 300 -m json.tool --sort-keys")
    assert len(lines) <= 15
    data = cli_json(dry_run(tmp_path, "run", "json.tool", "--env", "HF_TOKEN=s3cret-1", "--json"))
    hidden = {v["name"]: v for v in data["summary"]["env"]}
    assert hidden["HF_TOKEN"] == {"name": "HF_TOKEN", "value": None, "prepend": False, "secret": True}
    assert [summary.is_secret(n) for n in ("WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "NCCL_DEBUG", "KEYBOARD")] == \
        [True, True, False, False]


def _no_scontrol(monkeypatch) -> list[list[str]]:
    calls: list[list[str]] = []

    def run(args, timeout=20.0, check=True, input=None):
        calls.append(list(args))
        raise HpcError("stand-in: no Slurm command may run here", fix="-")
    monkeypatch.setattr("toolkit.slurm.commands.run", run)
    return calls


def test_a_sweep_summary_has_a_line_per_point_and_the_array_limit_of_the_given_cluster(tmp_path, monkeypatch):
    calls = _no_scontrol(monkeypatch)
    monkeypatch.delenv(sweep.MAX_ARRAY_SIZE_ENV, raising=False)
    cluster = gpu_cluster(tmp_path, CustomSlurmSettings=[{"MaxJobCount": 10000}, {"MaxArraySize": 3}])
    res = dry_run(tmp_path, "recipes", "submit", str(sweep_probe_recipe(tmp_path)), "--cluster", str(cluster),
                  "--queue", "cpu", "--sweep", "args.--count=1..7", "--sweep", "env.WANDB_API_KEY=k1")
    lines = res.stdout.splitlines()
    sweep_dir = Path(next(line for line in lines if line.startswith("sweep dir:")).split()[-1])
    start = lines.index(f"sweep:       7 points as 3 job arrays (tasks 0-2, 3-5, 6-6), at most 3 tasks per array: "
                        f"MaxArraySize, from the CustomSlurmSettings of {cluster}")
    assert lines[start + 1:start + 8] == [f"  {i}: args.--count={i + 1} env.WANDB_API_KEY=<hidden>  "
                                          f"{sweep_dir / f'task-{i:03d}'}" for i in range(7)]
    assert "k1" not in res.stdout.replace(str(tmp_path), "") and calls == []  # the file's limit: no scontrol
    data = cli_json(dry_run(tmp_path, "recipes", "submit", str(sweep_probe_recipe(tmp_path)), "--cluster",
                            str(cluster), "--queue", "cpu", "--sweep", "args.--count=1..7", "--json"))
    assert data["arrays"] == data["summary"]["sweep"]["arrays"] and len(data["summary"]["sweep"]["points"]) == 7
    assert data["max_array_size_source"] == f"MaxArraySize, from the CustomSlurmSettings of {cluster}"


@pytest.mark.parametrize("settings, limit, words", [
    ({}, sweep.SLURM_DEFAULT_MAX_ARRAY_SIZE, "Slurm's default (neither the CustomSlurmSettings of {c} nor "
                                             "ParallelCluster sets it)"),
    ({"CustomSlurmSettings": [{"maxarraysize": "40"}]}, 40, "from the CustomSlurmSettings of {c}"),
    ({"CustomSlurmSettingsIncludeFile": "https://example.com/slurm.conf"}, sweep.SLURM_DEFAULT_MAX_ARRAY_SIZE,
     "its CustomSlurmSettingsIncludeFile was not read: set HPC_MAX_ARRAY_SIZE if that sets one"),
])
def test_the_limit_of_a_parallelcluster_config(tmp_path, settings, limit, words):
    cluster = gpu_cluster(tmp_path, **settings)
    size, source = sweep.config_max_array_size(str(cluster))
    assert size == limit and words.format(c=cluster) in source


def test_a_cluster_without_job_arrays_refuses_a_sweep_before_anything_is_written(tmp_path, monkeypatch):
    _no_scontrol(monkeypatch)
    monkeypatch.delenv(sweep.MAX_ARRAY_SIZE_ENV, raising=False)
    recipe = str(sweep_probe_recipe(tmp_path))
    for value, words, fix in ((0, "MaxArraySize is 0, from the CustomSlurmSettings of {c}: that cluster has job "
                                  "arrays disabled", "submit each point as its own job"),
                              ("ten", "{c}: Scheduling/SlurmSettings/CustomSlurmSettings MaxArraySize='ten' is not a "
                                      "whole number", "Slurm's default is 1001")):
        cluster = gpu_cluster(tmp_path, CustomSlurmSettings=[{"MaxArraySize": value}])
        res = run_hpc("recipes", "submit", recipe, "--cluster", str(cluster), "--queue", "cpu", "--executor",
                      "slurm", "--sweep", "args.--count=1,2", env=environ(tmp_path))
        assert res.returncode == 1 and "Traceback" not in res.stderr
        assert f"error: {words.format(c=cluster)}" in res.stderr and fix in res.stderr
        assert res.stderr.count("error:") == 1 and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command", [("recipes", "submit", "resnet50"), ("run", "json.tool"),
                                     ("recipes", "submit", "resnet50", "--sweep", "args.--seed=1,2")])
def test_verbose_without_a_dry_run_is_a_usage_error_and_submits_nothing(tmp_path, command):
    res = run_hpc(*command, "--verbose", env=environ(tmp_path))
    assert res.returncode == 2 and "Traceback" not in res.stderr and res.stderr.count("error:") == 1
    assert "error: --verbose shows a dry run in full" in res.stderr and "fix: add --dry-run" in res.stderr
    assert not (tmp_path / "runs").exists()


def shared_cluster(tmp_path: Path) -> tuple[Path, Path]:
    """The tests' cluster config with its FSx mounted at TMP/fsx (so a test can put files under it): (config, fsx)."""
    config = yaml.safe_load(yaml.safe_dump(CLUSTER_CONFIG))
    fsx = tmp_path / "fsx"
    config["SharedStorage"][0]["MountDir"] = str(fsx)
    path = tmp_path / "shared-cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, fsx


def test_a_multi_node_jobs_script_and_venv_outside_the_shared_file_systems_are_warned(tmp_path):
    cluster, fsx = shared_cluster(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("")
    res = dry_run(tmp_path, "run", "train.py", "--nodes", "2", "--cluster", str(cluster), "--queue", "cpu",
                  "--venv", str(venv))
    mounts = f"({fsx}, /home)"
    assert (f"warning: script {tmp_path / 'train.py'} is outside the cluster's shared file systems {mounts}: the "
            "job's other nodes cannot read it") in res.stderr
    assert f"warning: venv {venv} is outside the cluster's shared file systems {mounts}" in res.stderr
    # one node reads what the submitting host wrote... only if it is that host: no warning for a one-node job
    one = dry_run(tmp_path, "run", "train.py", "--nodes", "1", "--cluster", str(cluster), "--queue", "cpu",
                  "--venv", str(venv))
    assert "shared file systems" not in one.stderr
    # under the FSx: nothing to say
    (fsx / "env" / "bin").mkdir(parents=True)
    (fsx / "env" / "bin" / "activate").write_text("")
    (fsx / "train.py").write_text("print('hi')\n")
    shared = dry_run(tmp_path, "run", str(fsx / "train.py"), "--nodes", "2", "--cluster", str(cluster),
                     "--queue", "cpu", "--venv", str(fsx / "env"))
    assert "shared file systems" not in shared.stderr


def test_a_data_dir_outside_the_shared_file_systems_is_warned_in_the_plan(tmp_path):
    from tests.jobhelpers import MINIMAL_RECIPE, write_recipe
    from toolkit.submit import plan as plans

    cluster, fsx = shared_cluster(tmp_path)
    local = yaml.safe_load(yaml.safe_dump(MINIMAL_RECIPE))
    local["dirs"]["root"] = str(tmp_path / "local")
    p = plans.plan(SubmitRequest(str(write_recipe(tmp_path, local)), nodes=2, cluster=str(cluster), queue="cpu"))
    # (the recipe's venv, this test's own, is warned about too)
    assert [w for w in p.warnings if w.startswith("data dir")] == [
        f"data dir {tmp_path / 'local' / 'data'} is outside the cluster's shared file systems ({fsx}, /home): the "
        "job's other nodes cannot read it; move it under one of them"]
    on_fsx = plans.plan(SubmitRequest(str(write_recipe(tmp_path, MINIMAL_RECIPE, "fsx.yaml")), nodes=2,
                                      cluster=str(cluster), queue="cpu"))
    assert on_fsx.spec.dirs["data"] == str(fsx / "data") and not [w for w in on_fsx.warnings
                                                                   if w.startswith("data dir")]


def test_the_summary_shows_the_container_image_and_its_mounts(tmp_path):
    cluster, fsx = shared_cluster(tmp_path)
    (fsx / "train.py").parent.mkdir(parents=True)
    (fsx / "train.py").write_text("print('hi')\n")
    image = f"{fsx}/images/pytorch.sqsh"
    args = ("run", str(fsx / "train.py"), "--nodes", "2", "--cluster", str(cluster), "--queue", "cpu",
            "--container", image, "--container-mount", f"{fsx}/data:/data:ro")
    lines = dry_run(tmp_path, *args).stdout.splitlines()
    run_dir = next(line for line in lines if line.startswith("run dir:")).split()[-1]
    start = lines.index(f"container:   {image} (pyxis, every rank)")
    assert lines[start + 1:start + 3] == [f"mounts:      {fsx}/data:/data:ro", f"             {run_dir}:{run_dir}"]
    data = cli_json(dry_run(tmp_path, *args, "--json"))
    assert data["summary"]["container"]["image"] == image
    assert data["summary"]["container"]["mounts"][0] == f"{fsx}/data:/data:ro"
    # a squashfs image on the submitting host alone: the other node cannot start the container
    local = dry_run(tmp_path, *args[:-4], "--container", str(tmp_path / "pytorch.sqsh"))
    assert f"warning: container image {tmp_path / 'pytorch.sqsh'} is outside the cluster's shared" in local.stderr
