"""`hpc run` end to end on the real local Slurm, 2 nodes x 2 ranks: recipes/examples/ddp_train.py (written like
PyTorch's DDP tutorial) under both launcher styles, a worker killed under torchrun, and bad input.

The nodes run this checkout's toolkit (PYTHONPATH in the job's env: the venv's own install is the main checkout's).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import cli_json, REPO, free_port, run_hpc, slurm_env, wait_until
from tests.test_own_code import DDP, PAYLOADS, strays
from tests.test_plan_slurm import plan_file, same_but_run_dir

pytestmark = [pytest.mark.slurm, pytest.mark.training]
TIMEOUT = 900  # the sandbox is shared with other agents' jobs


def hpc_run(sandbox, tmp_path: Path, target: str, *args: str, script_args: tuple[str, ...] = (), dry: bool = False,
            wait: bool = True) -> subprocess.CompletedProcess:
    env = dict(slurm_env(sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    # submitit's side (--executor slurm): these tests read its per-rank logs and the batch script it sent
    return run_hpc("run", target, "--nodes", "2", "--cluster", str(sandbox.cluster_config), "--queue", "cpu",
                   "--time", "00:15:00", "--env", f"PYTHONPATH={REPO}", "--executor", "slurm", *args,
                   *(["--wait"] if wait else []), *(["--dry-run"] if dry else []), "--json", "--", *script_args,
                   env=env, cwd=tmp_path,
                   timeout=TIMEOUT)


def records(run: Path) -> list[dict]:
    """Every JSON line the ranks printed (all ranks' stdout). Under torchrun a node's ranks share one log, where
    two ranks' lines can interleave: those are left out (the assertions need each rank's own line only once)."""
    found = []
    for path in sorted((run / "submitit").glob("*_log.out")):
        for line in path.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return [r for r in found if isinstance(r, dict)]


def job_gone(sandbox, job_id: str) -> bool:
    res = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                         env=slurm_env(sandbox), timeout=60)
    return res.stdout.strip() == ""


def ends_cleanly(sandbox, job_id: str, tmp_path: Path) -> None:
    """The job leaves the queue and leaves no process behind. Waited for: with accounting, sacct has the job's end
    (what --wait reads) once its batch step ends, while squeue shows it COMPLETING until every node's processes
    are gone (KillWait) and its epilog ran: a moment, which a loaded machine stretched past --wait's return."""
    wait_until(lambda: job_gone(sandbox, job_id), 60, f"job {job_id} to leave the queue")
    assert not strays(str(tmp_path))


@pytest.mark.parametrize("launcher", ["script", "torchrun"])
def test_ddp_example_runs_on_two_nodes_and_dry_run_is_what_ran(slurm_sandbox, tmp_path, launcher):
    args = ("--launcher", launcher)
    script_args = ("--steps", "40", "--checkpoint-dir", str(tmp_path / "ckpt"))
    dry_res = hpc_run(slurm_sandbox, tmp_path, str(DDP), *args, script_args=script_args, dry=True, wait=False)
    assert dry_res.returncode == 0, dry_res.stderr
    dry = cli_json(dry_res)
    res = hpc_run(slurm_sandbox, tmp_path, str(DDP), *args, script_args=script_args)
    assert res.returncode == 0, res.stderr
    result = cli_json(res)
    assert result["state"] == "COMPLETED" and result["ranks"] == 4
    run = Path(result["run_dir"])

    # --dry-run --json is what was submitted: the script, submitit's parameters, the batch script sbatch got.
    same_but_run_dir(dry["script"], (run / "job.sbatch").read_text(), dry["run_dir"], str(run))
    same_but_run_dir(json.dumps(dry["parameters"]), json.dumps(plan_file(run)["parameters"]), dry["run_dir"], str(run))
    sent = (run / "submitit" / f"{result['job_id']}_submission.sh").read_text()
    same_but_run_dir(dry["batch_script"], sent, dry["run_dir"], str(run))

    seen = {r["rank"]: r for r in records(run) if r["event"] == "rank_env"}
    assert sorted(seen) == [0, 1, 2, 3]
    for rank, r in seen.items():
        assert r["env"]["RANK"] == str(rank) and r["env"]["LOCAL_RANK"] == str(rank % 2)
        assert r["env"]["WORLD_SIZE"] == "4" and r["env"]["LOCAL_WORLD_SIZE"] == "2"
        assert r["env"]["GROUP_RANK"] == str(rank // 2) and r["host"] == f"c{rank // 2 + 1}"
        assert r["env"]["MASTER_ADDR"] == "c1" and r["world_size"] == 4
    # torchrun: one Slurm task per node, each the parent of its node's two ranks
    assert len(list((run / "submitit").glob("*_log.out"))) == (2 if launcher == "torchrun" else 4)

    report = run_hpc("report", "run", str(run), "--json", env=slurm_env(slurm_sandbox))
    assert report.returncode == 0, report.stderr
    training = cli_json(report)["training"]
    losses = [loss for _step, loss in training["loss_curve"]]
    assert training["updates"] == 40 and all(map(math.isfinite, losses)) and losses[-1] < losses[0] / 4

    # Heartbeats (the example's beat(step)): every rank reached step 40, no stall and no hang record (no false alarm).
    status = run_hpc("jobs", "status", result["job_id"], "--json",
                     env=dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs")))
    assert status.returncode == 0, status.stdout + status.stderr
    shown = cli_json(status)
    progress = shown["progress"]
    assert progress["ranks"] == 4 and progress["steps"] == [40, 40] and progress["lines"] == []
    assert progress["hang"] is None and not (run / "hang.json").exists()
    # The pre-flight ran once, on both nodes, before the ranks, and found nothing wrong (no false alarm).
    assert [(r["action"], r["nodes"], r["failed"]) for r in shown["preflight"]] == [("passed", ["c1", "c2"], {})]


def test_the_torchrun_tutorials_script_runs_unchanged(slurm_sandbox, tmp_path):
    """recipes/examples/elastic_train.py is PyTorch's fault-tolerance tutorial script (snapshot, resume), under
    torchrun as the tutorial runs it (the script launcher's rank environment: the DDP example's test above)."""
    snapshot = tmp_path / "snapshot.pt"
    res = hpc_run(slurm_sandbox, tmp_path, str(REPO / "recipes" / "examples" / "elastic_train.py"), "--launcher",
                  "torchrun", script_args=("3", "1", "--snapshot_path", str(snapshot)))
    assert res.returncode == 0, res.stderr
    run = Path(cli_json(res)["run_dir"])
    out = "".join(p.read_text() for p in (run / "submitit").glob("*_log.out"))
    for rank in range(4):  # every rank trained every epoch, on a quarter of the data (DistributedSampler)
        for epoch in range(3):
            assert f"[CPU{rank}] Epoch {epoch} | Batchsize: 32 | Steps: 16" in out
    assert "Epoch 3 | Training snapshot saved" in out and snapshot.exists()


def test_torchrun_restarts_a_killed_worker_and_resumes_from_the_checkpoint(slurm_sandbox, tmp_path):
    ckpt, pids = tmp_path / "ckpt", tmp_path / "pids"
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    cmd = ["run", str(DDP), "--nodes", "2", "--cluster", str(slurm_sandbox.cluster_config), "--queue", "cpu",
           "--time", "00:15:00", "--env", f"PYTHONPATH={REPO}", "--executor", "slurm", "--launcher", "torchrun",
           "--max-restarts", "2",
           "--wait", "--json", "--", "--steps", "20", "--step-seconds", "0.2", "--checkpoint-every", "5",
           "--checkpoint-dir", str(ckpt), "--pid-dir", str(pids)]
    import sys

    import torch  # before the job starts: importing it between the first checkpoint and the kill takes seconds

    proc = subprocess.Popen([sys.executable, "-m", "toolkit", *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(env, PYTHONPATH=str(REPO)), cwd=tmp_path)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not ((ckpt / "checkpoint.pt").exists() and (pids / "rank-3.pid").exists()):
            assert proc.poll() is None and time.monotonic() < deadline, "the job never saved a checkpoint"
            time.sleep(0.2)
        saved = torch.load(ckpt / "checkpoint.pt")["step"]
        os.kill(int((pids / "rank-3.pid").read_text()), signal.SIGKILL)  # a worker of the second node
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    result = cli_json(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    assert result["state"] == "COMPLETED"
    seen = records(Path(result["run_dir"]))
    resumed = [r["step"] for r in seen if r["event"] == "resumed"]
    assert len(resumed) == 1 and resumed[0] >= saved > 0
    restarted = [r for r in seen if r["event"] == "rank_env" and r["env"]["TORCHELASTIC_RESTART_COUNT"] == "1"]
    assert {r["host"] for r in restarted} >= {"c2"}  # the killed worker's node restarted its workers
    # and --wait said so (torchrun itself logs it below its default level)
    assert {"node": "c2", "restart": 1, "of": "2"} in result["torchrun_restarts"]
    assert "torchrun restarted the workers (restart 1 of 2) after a worker on c2 failed" in err
    assert max(r["step"] for r in seen if r["event"] == "train") == 20
    ends_cleanly(slurm_sandbox, result["job_id"], tmp_path)


def test_the_resnet_recipe_trains_under_torchrun(slurm_sandbox, tmp_path):
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    res = run_hpc("recipes", "submit", "resnet50", "--profile", "smoke", "--nodes", "2", "--cluster",
                  str(slurm_sandbox.cluster_config), "--queue", "cpu", "--executor", "slurm", "--set",
                  "launcher.style=torchrun", "--set",
                  "launcher.max_restarts=1", "--set", f"env.PYTHONPATH={REPO}", "--set", "args.--max-steps=6",
                  "--wait", "--json", env=env,
                  cwd=tmp_path, timeout=TIMEOUT)
    assert res.returncode == 0, res.stderr
    result = cli_json(res)
    run = Path(result["run_dir"])
    from toolkit.workloads.train_log import read_log

    log = read_log(run / "logs" / "train_log.jsonl")
    start = next(r for r in log if r["event"] == "start")
    assert start["world_size"] == 4 and log[-1]["event"] == "end" and log[-1]["status"] == "max_steps"
    assert log[-1]["step"] == 6
    assert len(list((run / "submitit").glob("*_log.out"))) == 2  # one torchrun per node


def one_clear_failure(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    return res.stderr


def test_a_module_missing_on_the_nodes_fails_wait_naming_the_ranks_log(slurm_sandbox, tmp_path):
    res = hpc_run(slurm_sandbox, tmp_path, "no_such_pkg.train")
    err = one_clear_failure(res)
    result = cli_json(res)
    assert result["state"] == "FAILED"
    line = next(line for line in err.splitlines() if line.startswith(f"job {result['job_id']} ended FAILED"))
    assert "module 'no_such_pkg.train' cannot be imported" in line and result["failed_rank_log"] in line
    ends_cleanly(slurm_sandbox, result["job_id"], tmp_path)


def test_a_script_that_ignores_the_environment_ends_at_the_rendezvous_timeout(slurm_sandbox, tmp_path):
    start = time.monotonic()
    res = hpc_run(slurm_sandbox, tmp_path, str(PAYLOADS / "ignores_env.py"), "--rendezvous-timeout", "8",
                  script_args=(str(free_port()),))
    err = one_clear_failure(res)
    assert time.monotonic() - start < 300  # not the 15-minute time limit
    result = cli_json(res)
    assert "init_process_group did not complete within 8 s" in err and result["state"] == "FAILED"
    ends_cleanly(slurm_sandbox, result["job_id"], tmp_path)
