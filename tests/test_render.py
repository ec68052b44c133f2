"""Rendered sbatch scripts: valid bash, the right directives, CPU forms, and jobs/ matching today's render."""

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.jobhelpers import CPU, P3DN, parse_flags
from toolkit.cluster.queues import Queue, load_queues
from toolkit.errors import HpcError
from toolkit.slurm.render import render_script
from toolkit.job.rank import master_port, preview_argv
from toolkit.job.spec import time_minutes
from toolkit.launchers.trainer import GPU_LOADERS
from toolkit.slurm.materialize import build_job_spec
from toolkit.recipes.load import list_recipe_files, load_recipe

RECIPES = [p.stem for p in list_recipe_files()]
QUEUES = [P3DN, CPU, Queue(name="p3", instance_type="p3.16xlarge", max_nodes=16, efa_stack="none"),
          Queue(name="p4d", instance_type="p4d.24xlarge", max_nodes=16, efa_stack="legacy")]


def renders():
    for name in RECIPES:
        recipe = load_recipe(name)
        for queue in QUEUES:
            if ("gpu" if queue.gpus_per_node else "cpu") in recipe.resources.runs_on:
                for profile in [None, *recipe.profiles]:
                    # a GPU data loader is refused on queues without CUDA (tests/test_resnet_loader.py)
                    loader = load_recipe(name, profile=profile).args.get("--loader")
                    if queue.gpus_per_node or loader not in GPU_LOADERS:
                        yield name, queue, profile


@pytest.mark.parametrize("name,queue,profile", list(renders()), ids=lambda v: getattr(v, "name", v))
def test_every_render_is_valid_bash(name, queue, profile):
    recipe = load_recipe(name, profile=profile)
    nodes = 1 if name != "nccl-tests" else 2
    script = render_script(build_job_spec(recipe, queue, nodes, profile=profile))
    res = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("path", sorted((REPO / "jobs").glob("*.sbatch")), ids=lambda p: p.name)
def test_jobs_dir_matches_todays_rendering(path):
    name, nodes, queue_name = re.fullmatch(r"(.+)-(\d+)x(p3dn|dl1)\.sbatch", path.name).groups()
    queue = load_queues(REPO / "jobs" / f"{queue_name}-cluster.yaml")[queue_name]
    spec = build_job_spec(load_recipe(name), queue, int(nodes), run_dir=f"/fsx/runs/{path.stem}")  # as `make jobs`
    assert path.read_text() == render_script(spec), \
        "jobs/ is stale: run `make jobs` and review the diff"


def test_each_reviewed_render_has_its_own_run_dir():
    """A job writes its generated DeepSpeed config (per world size) and checkpoints into its run dir: renders at
    other node counts or on other queues must not name the same one."""
    run_dirs = {}
    for path in sorted((REPO / "jobs").glob("*.sbatch")):
        [output] = re.findall(r"^#SBATCH --output=(\S+)/[^/]+$", path.read_text(), re.MULTILINE)
        assert output not in run_dirs, f"{path.name} and {run_dirs[output]} share the run dir {output}"
        run_dirs[output] = path.name
    bert = (REPO / "jobs" / "bert-5b-16xdl1.sbatch").read_text()
    assert "> /fsx/runs/bert-5b-16xdl1/deepspeed.json" in bert


def test_jobs_dir_has_the_reviewed_examples():
    assert {p.name for p in (REPO / "jobs").glob("*.sbatch")} == {
        "roberta-8xp3dn.sbatch", "transformer-4xp3dn.sbatch", "resnet50-8xp3dn.sbatch", "nccl-tests-2xp3dn.sbatch",
        "collectives-2xp3dn.sbatch", "bert-5b-16xdl1.sbatch", "collectives-4xdl1.sbatch", "resnet50-8xdl1.sbatch"}


def test_gpu_directives():
    options = {"account": "ml-team", "qos": "high", "reservation": "res1", "dependency": "afterok:12:13"}
    script = render_script(build_job_spec(load_recipe("roberta"), P3DN, 8, slurm_options=options))
    directives = [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]
    assert directives == [
        "--job-name=roberta", "--partition=p3dn", "--nodes=8", "--ntasks-per-node=8", "--gpus-per-node=8",
        "--cpus-per-task=12", "--time=5-00:00:00", "--exclusive", "--wait-all-nodes=1", "--requeue",
        "--account=ml-team", "--qos=high", "--reservation=res1", "--dependency=afterok:12:13",
        "--output=/fsx/runs/roberta/roberta-%j.out", "--open-mode=append",
        "--export=PATH,HOME,USER,LOGNAME,SHELL,LANG,LC_ALL,LC_CTYPE,TZ,TMPDIR", "--signal=B:USR2@120"]
    assert not [d for d in directives if d.startswith("--mem")]
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert "--cpus-per-task=12" in srun and "--ntasks-per-node=8" in srun and "--gpus-per-task" not in srun
    assert srun.startswith("srun --label ")  # the ranks share one log: each line names its task


def test_cpu_queue_gets_the_cpu_forms_of_fairseq():
    spec = build_job_spec(load_recipe("roberta"), CPU, 2)
    flags = parse_flags(preview_argv(spec.command, {"RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "a",
                                            "MASTER_PORT": "1"})[1:])
    assert flags["--cpu"] == [] and flags["--distributed-backend"] == ["gloo"]
    assert flags["--ddp-backend"] == ["legacy_ddp"] and flags["--distributed-no-spawn"] == []
    assert not {"--fp16", "--memory-efficient-fp16", "--bf16"} & set(flags)
    assert "--gpus-per-node" not in render_script(spec)


def test_cpu_queue_gets_the_cpu_forms_of_our_trainer():
    spec = build_job_spec(load_recipe("resnet50"), CPU, 2)
    flags = parse_flags([w for w in spec.command if isinstance(w, str)][3:])
    assert flags["--device"] == ["cpu"] and flags["--backend"] == ["gloo"] and flags["--threads"] == ["1"]
    assert "--amp" not in flags


def test_gpu_only_recipe_refuses_a_cpu_queue():
    with pytest.raises(HpcError, match="runs on gpu only"):
        build_job_spec(load_recipe("nccl-tests"), CPU, 1)


def test_nodes_beyond_the_queue_are_refused():
    with pytest.raises(HpcError, match="at most 2"):
        build_job_spec(load_recipe("resnet50"), CPU, 3)


@pytest.mark.parametrize("field,value", [("account", "a\nrm -rf /"), ("qos", "x y"), ("dependency", "$(id)"),
                                         ("reservation", "'r'")])
def test_values_in_sbatch_lines_are_restricted(field, value):
    with pytest.raises(HpcError, match="cannot go into an #SBATCH line"):
        build_job_spec(load_recipe("resnet50"), P3DN, 1, slurm_options={field: value})


def test_run_dir_from_a_hostile_root_is_refused(tmp_path):
    with pytest.raises(HpcError, match="run dir"):
        build_job_spec(load_recipe("resnet50", overrides=["dirs.root=/tmp/x\ntouch pwned"]), P3DN, 1)


def test_master_port_is_distinct_below_ephemeral_ports_and_the_same_in_every_process_and_path():
    ports = [master_port(job_id) for job_id in range(1, 5000)]
    assert len(set(ports)) == len(ports) and all(1024 < p < 32768 for p in ports)
    # Another process (another hash seed) computes the same port, and so does the rendered script's shell
    # arithmetic, which is what the ranks of a rendered job use.
    job_ids = (7, 123456, 4999)
    other = subprocess.run([sys.executable, "-c", "import sys; from toolkit.job.rank import master_port; "
                            "print(*[master_port(int(j)) for j in sys.argv[1:]])", *map(str, job_ids)],
                           capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "12345",
                                                                "PYTHONPATH": str(REPO)}, check=True)
    assert other.stdout.split() == [str(master_port(j)) for j in job_ids]
    line = next(x for x in render_script(build_job_spec(load_recipe("resnet50"), P3DN, 2)).splitlines()
                if x.startswith("MASTER_PORT=$(("))
    for job_id in job_ids:
        shell = subprocess.run(["bash", "-c", f"{line}; echo $MASTER_PORT"], capture_output=True, text=True,
                               env={"SLURM_JOB_ID": str(job_id)}, check=True)
        assert int(shell.stdout) == master_port(job_id)


@pytest.mark.parametrize("text,minutes", [("30", 30), ("01:30", 2), ("02:00:00", 120), ("1-00:00:00", 1440),
                                          ("2-3", 51 * 60), ("1-0:30", 1470)])
def test_time_limit_in_minutes(text, minutes):
    assert time_minutes(text) == minutes


@pytest.mark.parametrize("recipe,queue", [("resnet50", P3DN), ("nccl-tests", P3DN)])  # a training job, a benchmark
def test_the_rendered_script_records_how_the_job_ended_in_its_run_dir(tmp_path, recipe, queue):
    """The rendered script's batch shell writes result.json with its ranks' step's status, ok or not, as its last
    word (toolkit.slurm.render.end_record_line): what `hpc jobs status` reads once Slurm has forgotten the job. Here
    the script's own tail runs in bash, from its srun line on, with srun a stub (named so) that exits 0, then 3; a
    run dir that is gone leaves the job's status alone."""
    from toolkit.rundir import RunDir

    run = RunDir(tmp_path / "run").create()
    script = render_script(build_job_spec(load_recipe(recipe), queue, 1, run_dir=str(run.path)))
    tail = script[script.index("\nCOMMAND=("):]  # the rank program's words, the srun line and what follows it
    assert tail.count("result.json.$$ ") == 2  # one record (written aside, moved), after the ranks' step
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "srun").write_text('#!/bin/sh\n# a stand-in for Slurm\'s srun: the ranks\' step\'s status\nexit "$STUB"\n')
    (stub / "srun").chmod(0o755)
    for status, ok in ((0, True), (3, False)):
        res = subprocess.run(["bash", "-c", "set -euo pipefail" + tail], capture_output=True, text=True, timeout=30,
                             env={**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "STUB": str(status),
                                  "SLURMD_NODENAME": "c7", "SLURM_JOB_ID": "55"})
        assert res.returncode == status, res.stderr
        ended = run.result()
        assert ended is not None and (ended.ok, ended.exit_code, ended.host, ended.rank) == (ok, status, "c7", None)
        assert run.outcome() is ok and [p.name for p in run.path.iterdir()] == ["result.json"]
    run.path.joinpath("result.json").unlink()
    run.path.rmdir()
    res = subprocess.run(["bash", "-c", "set -euo pipefail" + tail], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "STUB": "0"})
    assert res.returncode == 0, res.stderr
