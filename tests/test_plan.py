"""The submission plan without Slurm: one source for #SBATCH lines and submitit's parameters, the executor kinds,
and benchmarks that never requeue."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading

import pytest

from tests.conftest import run_hpc
from tests.jobhelpers import CPU, P3DN, probe_recipe, write_cluster
from toolkit.job.render import job_options, render_script
from toolkit.job.spec import build_job_spec
from toolkit.recipes.load import load_recipe
from toolkit.submit import plan as plans
from toolkit.submit.executor import submitit_batch_script
from toolkit.submit.launcher import _run


def sbatch_lines(script: str) -> dict[str, str | bool]:
    options: dict[str, str | bool] = {}
    for line in script.splitlines():
        match = re.match(r"#SBATCH --([a-z-]+)(?:=(.*))?$", line)
        if match:
            options[match.group(1)] = True if match.group(2) is None else match.group(2).strip("'")
    return options


@pytest.mark.parametrize("name,queue,nodes", [("roberta", P3DN, 8), ("resnet50", CPU, 2), ("collectives", P3DN, 2),
                                              ("transformer", P3DN, 4)])
def test_the_rendered_script_and_submitits_batch_script_carry_the_same_job_options(tmp_path, name, queue, nodes):
    spec = build_job_spec(load_recipe(name), queue, nodes, slurm_options={"account": "ml", "dependency": "afterok:1"})
    rendered = sbatch_lines(render_script(spec))
    submitit = sbatch_lines(submitit_batch_script(spec, tmp_path / "submitit"))
    for option, value in job_options(spec).items():
        expected = True if value is True else str(value)
        assert rendered[option] == expected and submitit[option] == expected, option
    # What differs is each path's own: where logs go, how the environment is passed, who gets the stop signal.
    assert submitit["export"] == "ALL" and rendered["export"].startswith("PATH,")


@pytest.mark.parametrize("name", ["nccl-tests", "collectives"])
def test_benchmarks_do_not_requeue_and_say_why(tmp_path, name):
    spec = build_job_spec(load_recipe(name), P3DN, 2)
    script = render_script(spec)
    options = sbatch_lines(script)
    assert options.get("no-requeue") is True and "requeue" not in options and "signal" not in options
    assert "trap" not in script and "scontrol requeue" not in script
    assert "A benchmark: not requeued" in script and "requeue itself forever" in script
    if not spec.mpi:
        assert sbatch_lines(submitit_batch_script(spec, tmp_path))["no-requeue"] is True
    training = sbatch_lines(render_script(build_job_spec(load_recipe("roberta"), P3DN, 2)))
    assert training["requeue"] is True and "no-requeue" not in training


@pytest.mark.parametrize("requeue,expected", [(True, (-signal.SIGTERM, True)), (False, (0, False))])
def test_a_benchmark_rank_ignores_the_stop_signal(requeue, expected):
    """SIGUSR2 before the time limit ends a training workload that cannot save (it resumes after the requeue);
    a benchmark is never requeued, so it runs on."""
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGUSR2))
    timer.start()
    try:
        assert _run([sys.executable, "-c", "import time; time.sleep(2)"], dict(os.environ), False, requeue) == expected
    finally:
        timer.cancel()


def test_executor_kinds(tmp_path):
    cluster = str(write_cluster(tmp_path))
    probe = str(probe_recipe(tmp_path))
    slurm = plans.plan(plans.SubmitRequest(probe, nodes=1, cluster=cluster, queue="cpu", executor="slurm"),
                       tmp_path / "run")
    assert slurm.executor == "submitit-slurm" and slurm.batch_script and slurm.argv is None
    assert slurm.parameters["additional_parameters"]["partition"] == "cpu"
    local = plans.plan(plans.SubmitRequest(probe, nodes=1, cluster=cluster, queue="cpu", executor="local"),
                       tmp_path / "run")
    assert local.executor == "submitit-local" and local.batch_script is None
    assert local.parameters == {"nodes": 1, "tasks_per_node": 2, "timeout_min": 5}
    mpi = plans.plan(plans.SubmitRequest(probe, nodes=2, cluster=cluster, queue="cpu", executor="slurm",
                                         overrides=("launcher.mpi=pmix",)), tmp_path / "run")
    assert mpi.executor == "sbatch" and mpi.argv == ("sbatch", "--parsable", str(tmp_path / "run" / "job.sbatch"))
    assert mpi.parameters == {} and f"--output={tmp_path / 'run'}/" in mpi.script
    with pytest.raises(Exception, match="only Slurm can start"):
        plans.plan(plans.SubmitRequest(probe, cluster=cluster, queue="cpu", executor="local",
                                       overrides=("launcher.mpi=pmix",)), tmp_path / "run")


def test_dry_run_json_is_the_plan_with_the_run_dir_it_would_use(tmp_path):
    env = {**os.environ, "HPC_RUNS_DIR": str(tmp_path / "runs")}
    res = run_hpc("recipes", "submit", "nccl-tests", "--nodes", "2", "--dry-run", "--json",
                  "--executor", "slurm", env=env)
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    run_dir = plan["run_dir"]
    assert run_dir.startswith(str(tmp_path / "runs")) and not os.path.exists(run_dir)
    assert plan["executor"] == "sbatch" and plan["argv"] == ["sbatch", "--parsable", f"{run_dir}/job.sbatch"]
    assert f"#SBATCH --output={run_dir}/nccl-tests-%j.out" in plan["script"] and "/fsx/runs" not in plan["script"]
    human = run_hpc("recipes", "submit", "nccl-tests", "--nodes", "2", "--dry-run", "--executor", "slurm", env=env)
    assert "with: sbatch: sbatch --parsable" in human.stdout and "slurm executor" not in human.stdout
