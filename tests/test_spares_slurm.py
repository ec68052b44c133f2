"""Hot spares on the local Slurm (toolkit.node.spares): a job holds 2 nodes and trains on 1; its node is lost for
real mid-run (testbench.faults.lost_node: its slurmd, slurmstepd and ranks SIGKILLed at once) or one of its ranks
is killed, and the job finishes on the other node of the same allocation from its last checkpoint, the restart
written in the run dir and shown by `hpc jobs status`. The batch host (c1) is the spare: the supervisor keeps it
out of training while another node can train, so the node lost is c2. Twenty kills at random steps, and the time
from the fault to the next step against a requeue: benchmarks/bench_spares.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from tests.conftest import REPO, cli_envelope, cli_json, run_hpc, slurm_env, wait_until
from tests.jobhelpers import goodput_ledger
from testbench.faults import lost_node, restore_node
from toolkit.rundir import RunDir

pytestmark = [pytest.mark.slurm, pytest.mark.training]
DDP = REPO / "recipes" / "examples" / "ddp_train.py"
CHECKPOINT_EVERY = 2
# The nodes run this checkout's toolkit; heartbeats every second, so a lost node's ranks are silent after 3 s.
JOB_ENV = ["--env", f"PYTHONPATH={REPO}", "--env", "HPC_HEARTBEAT_INTERVAL=1"]


def job_state(sandbox, job_id: str) -> str:
    res = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                         env=slurm_env(sandbox), timeout=60)
    return res.stdout.strip()


def events(run: RunDir, job_id: str) -> list[dict]:
    """The ranks' JSON lines in the job's log (srun --label: `N: {...}`), with the task number as `task`."""
    found = []
    path = run.job_output(job_id)
    for line in (path.read_text().splitlines() if path else []):
        task, _, text = line.partition(": ")
        if task.strip().isdigit() and text.startswith("{"):
            found.append({**json.loads(text), "task": int(task)})
    return found


def run_through_a_fault(sandbox, tmp_path, fault, *extra: str, steps: int = 14) -> tuple[dict, RunDir, list[dict]]:
    """Submit ddp_train.py on 1 node + 1 spare, apply `fault` once a checkpoint exists and steps are being made,
    and wait for the job's end. Returns the submission, its run dir and its ranks' events."""
    env = dict(slurm_env(sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    ckpt = tmp_path / "ckpt"
    submitted = run_hpc("run", str(DDP), "--nodes", "1", "--spares", "1", *JOB_ENV, *extra, "--json", "--",
                        "--steps", str(steps), "--step-seconds", "0.5", "--checkpoint-every", str(CHECKPOINT_EVERY),
                        "--log-every", "1", "--checkpoint-dir", str(ckpt), env=env, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job = cli_json(submitted)
    run = RunDir(job["run_dir"])
    try:
        wait_until(lambda: (ckpt / "checkpoint.pt").exists() and any((b.step or 0) >= 3 for b in run.heartbeats()),
                   180, "a checkpoint and step 3")
        assert {b.node for b in run.heartbeats()} == {"c2"}  # the batch host c1 is the spare
        fault(run)
        wait_until(lambda: any(e.get("event") == "end" for e in events(run, job["job_id"])), 180, "the job's end")
        wait_until(lambda: job_state(sandbox, job["job_id"]) in ("", "COMPLETING"), 60, "the batch script's end")
    finally:
        restore_node("c2")
    wait_until(lambda: job_state(sandbox, job["job_id"]) == "", 60, "the job gone from the queue")
    return job, run, events(run, job["job_id"])


def assert_resumed_on_c1(found: list[dict]) -> None:
    """Both rounds saw one consistent world (ranks 0 and 1 of 2, rendezvous on their node), the second on c1,
    resuming from a checkpoint at most CHECKPOINT_EVERY steps behind the last step made; the job completed."""
    starts = [e for e in found if e["event"] == "rank_env"]
    assert [(s["rank"], s["host"]) for s in starts] == [(0, "c2"), (1, "c2"), (0, "c1"), (1, "c1")] or \
        sorted((s["rank"], s["host"]) for s in starts) == [(0, "c1"), (0, "c2"), (1, "c1"), (1, "c2")]
    for s in starts:  # under torchrun a Slurm task is a node's agent; under srun it is the rank
        assert s["env"]["WORLD_SIZE"] == "2" and s["env"]["RANK"] == str(s["rank"])
        assert s["task"] == (0 if s["env"]["TORCHELASTIC_RESTART_COUNT"] else s["rank"])
        assert s["env"]["MASTER_ADDR"] == s["host"]
    ports = {s["host"]: s["env"]["MASTER_PORT"] for s in starts}
    assert ports["c1"] != ports["c2"]  # a fresh rendezvous for the second round
    resumed = next(e["step"] for e in found if e["event"] == "resumed")
    before = max(e["step"] for e in found[:found.index(next(e for e in found if e["event"] == "resumed"))]
                 if e["event"] == "train")
    assert resumed >= CHECKPOINT_EVERY and before - resumed <= CHECKPOINT_EVERY
    assert found[-1]["event"] == "end" and found[-1]["status"] == "completed"


def test_a_lost_node_is_drained_and_the_job_finishes_on_the_spare(slurm_sandbox, tmp_path):
    # 10 steps, not 14: the fault stops the node's ranks at once, so no shorter run can end before it (the killed
    # rank's test keeps 14: the heartbeat it waits for lags the rank by up to 2 steps).
    job, run, found = run_through_a_fault(slurm_sandbox, tmp_path, lambda run: lost_node("c2"), steps=10)
    assert_resumed_on_c1(found)
    # Left out as soon as its ranks went silent; drained once the probe step failed to reach its slurmd.
    [restart, probe] = run.restarts()
    assert (restart["kind"], restart["nodes"], restart["next_nodes"]) == ("restart", ["c2"], ["c1"])
    assert restart["trigger"].startswith("heartbeats silent: ranks 0-1 on c2")
    assert (probe["kind"], probe["nodes"], probe["drained"]) == ("probe", ["c2"], ["c2"])
    assert "Communication connection failure" in probe["why"]

    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    status = run_hpc("jobs", "status", job["job_id"], "--json", env=env)
    data = cli_envelope(status)["data"]
    assert [(r["kind"], r["nodes"]) for r in data["restarts"]] == [("restart", ["c2"]), ("probe", ["c2"])], data
    text = run_hpc("jobs", "status", job["job_id"], env=env).stdout
    assert "restart 1:" in text and "c2" in text and "drained" in text

    # The goodput ledger adds up to Slurm's wall time; the work lost is the steps the second round made again.
    ledger = goodput_ledger(job["run_dir"], env, job["job_id"])
    resumed = next(e for e in found if e["event"] == "resumed")
    redone = max(e["step"] for e in found[:found.index(resumed)] if e["event"] == "train") - resumed["step"]
    [fault] = ledger["fault_list"]
    assert fault["steps_lost"] == redone and fault["cause"].startswith("restart on a spare: heartbeats silent")
    assert ledger["outcome"] == "completed" and ledger["seconds"]["checkpoint"] > 0
    assert ledger["seconds"]["lost"] > 0 or redone == 0


def test_a_killed_rank_under_torchrun_restarts_the_job_on_the_spare_without_draining_its_node(slurm_sandbox,
                                                                                             tmp_path):
    """torchrun's agent on c2 (no restarts of its own) fails when a worker is killed; srun names its task."""
    def kill_rank_1(run: RunDir) -> None:
        [rank_1] = [b for b in run.heartbeats() if b.rank == 1]
        os.kill(rank_1.pid, signal.SIGKILL)

    job, run, found = run_through_a_fault(slurm_sandbox, tmp_path, kill_rank_1, "--launcher", "torchrun")
    assert_resumed_on_c1(found)
    [restart] = run.restarts()  # no probe record: c2 answered, nothing drained
    assert (restart["kind"], restart["nodes"], restart["next_nodes"]) == ("restart", ["c2"], ["c1"])
    assert restart["trigger"].startswith("srun: c2: ") and "passed the probe" in restart["why"]
