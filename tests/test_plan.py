"""The submission plan without Slurm: the executor kinds, one rank program for all of them, the stop policy
(submitit's checkpoint protocol), and benchmarks that never requeue."""

from __future__ import annotations

import os
import re
import shlex
import signal
import sys

import pytest

from tests.conftest import cli_json, run_hpc
from tests.jobhelpers import P3DN, probe_recipe, submitits_stop_signal, write_cluster
from toolkit.slurm.render import render_script
from toolkit.slurm.materialize import build_job_spec
from toolkit.recipes.load import load_recipe
from toolkit.submit import plan as plans
from toolkit.slurm.executors import submitit_batch_script


def sbatch_lines(script: str) -> dict[str, str | bool]:
    options: dict[str, str | bool] = {}
    for line in script.splitlines():
        match = re.match(r"#SBATCH --([a-z-]+)(?:=(.*))?$", line)
        if match:
            options[match.group(1)] = True if match.group(2) is None else match.group(2).strip("'")
    return options


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


# A workload that saves and exits 75 on SIGUSR2 unless it was started with SIGUSR2 ignored; else runs 3 s.
WORKLOAD = ("import signal, sys, time; "
            "signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN or "
            "signal.signal(signal.SIGUSR2, lambda *_: (time.sleep(0.2), sys.exit(75))); time.sleep(3)")


@pytest.mark.parametrize("requeue,stops_on_signal,code,requeued", [
    (False, False, 0, False),  # a benchmark: runs on, never requeued
    (True, False, -signal.SIGTERM, True),  # cannot save: ended at once, requeued
    (True, True, 75, True),  # saves on the signal, then requeued
])
def test_the_stop_policy_answers_submitits_checkpoint_protocol(tmp_path, requeue, stops_on_signal, code, requeued):
    """Rank 0 of a submitit job when Slurm's SIGUSR2 comes: submitit's own handler calls checkpoint() (stood in
    for here by a handler that does what submitit/core/job_environment.py does), and Slurm signals the workload
    too. checkpoint() returns the resubmission only when the job is to be requeued, after the workload ended."""
    from toolkit import __version__
    from toolkit.job.rank import rank_program
    from toolkit.node.stop import StopPolicy
    from toolkit.slurm import rank_task

    program = rank_program((sys.executable, "-c", WORKLOAD), 1, 1, contract=True)
    task = rank_task.RankTask(program.argv, 1, str(tmp_path), __version__,
                              StopPolicy(requeue=requeue, saves_on_signal=stops_on_signal))
    with submitits_stop_signal(task) as answers:
        env = {**os.environ, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
        assert rank_task._run(list(task.argv), env, ignore_usr2=not (stops_on_signal and requeue)) == code
    assert len(answers) == 1
    assert (answers[0] is not None) == requeued
    if requeued:
        assert answers[0].function is task  # submitit pickles this and requeues the job


def test_executor_kinds(tmp_path):
    cluster = str(write_cluster(tmp_path))
    probe = str(probe_recipe(tmp_path))
    slurm = plans.plan(plans.SubmitRequest(probe, nodes=1, cluster=cluster, queue="cpu", executor="slurm"),
                       tmp_path / "run")
    assert slurm.executor == "slurm" and slurm.batch_script and slurm.argv is None
    assert slurm.parameters["additional_parameters"]["partition"] == "cpu"
    local = plans.plan(plans.SubmitRequest(probe, nodes=1, cluster=cluster, queue="cpu", executor="local"),
                       tmp_path / "run")
    assert local.executor == "local" and local.batch_script is None
    assert local.parameters == {"nodes": 1, "tasks_per_node": 2, "timeout_min": 5}
    mpi = plans.plan(plans.SubmitRequest(probe, nodes=2, cluster=cluster, queue="cpu", executor="slurm",
                                         overrides=("launcher.mpi=pmix",)), tmp_path / "run")
    assert mpi.executor == "sbatch" and mpi.argv == ("sbatch", "--parsable", "--export=ALL",
                                                     str(tmp_path / "run" / "job.sbatch"))
    assert mpi.parameters == {} and f"--output={tmp_path / 'run'}/" in mpi.script
    assert "srun --mpi ranks it" in " ".join(mpi.notes)  # asked for slurm, told why it goes to sbatch
    sent = plans.plan(plans.SubmitRequest(probe, nodes=1, cluster=cluster, queue="cpu", executor="sbatch"),
                      tmp_path / "run")
    assert sent.executor == "sbatch" and sent.argv == mpi.argv and sent.parameters == {}
    # Every kind's tasks run one rank program, the one the script's srun line starts.
    assert slurm.rank_program == local.rank_program == sent.rank_program
    assert shlex.quote(sent.spec.program.script) in sent.script
    with pytest.raises(Exception, match="not one of slurm, local, sbatch"):
        plans.plan(plans.SubmitRequest(probe, cluster=cluster, queue="cpu", executor="submitit-slurm"), tmp_path)
    with pytest.raises(Exception, match="only Slurm can start"):
        plans.plan(plans.SubmitRequest(probe, cluster=cluster, queue="cpu", executor="local",
                                       overrides=("launcher.mpi=pmix",)), tmp_path / "run")


def test_dry_run_json_is_the_plan_with_the_run_dir_it_would_use(tmp_path):
    env = {**os.environ, "HPC_RUNS_DIR": str(tmp_path / "runs")}
    res = run_hpc("recipes", "submit", "nccl-tests", "--nodes", "2", "--dry-run", "--json",
                  "--executor", "slurm", env=env)
    assert res.returncode == 0, res.stderr
    plan = cli_json(res)
    run_dir = plan["run_dir"]
    assert run_dir.startswith(str(tmp_path / "runs")) and not os.path.exists(run_dir)
    assert plan["executor"] == "sbatch"
    assert plan["argv"] == ["sbatch", "--parsable", "--export=ALL", f"{run_dir}/job.sbatch"]
    assert f"#SBATCH --output={run_dir}/nccl-tests-%j.out" in plan["script"] and "/fsx/runs" not in plan["script"]
    human = run_hpc("recipes", "submit", "nccl-tests", "--nodes", "2", "--dry-run", "--verbose", "--executor", "slurm",
                    env=env)
    assert "with: sbatch: sbatch --parsable" in human.stdout and "slurm executor" not in human.stdout
