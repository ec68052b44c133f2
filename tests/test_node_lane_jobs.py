"""hpc's node-side code in real jobs on the node lane (Debian bullseye nodes: python3 3.9, no hpc, no venv of
ours; tests/test_node_lane.py): `hpc run` submits a user's stdlib-only script, whose ranks beat with `from
hpc_node.heartbeat import beat` from the bundle the job staged; the hang watchdog ends a hung one naming its rank;
the spares supervisor ("$HPC_PYTHON" BUNDLE spares) moves a job whose node is lost for real (testbench.faults.
lost_node: its slurmd, slurmstepd and ranks SIGKILLed) to its spare, with heartbeats and without.

The nodes' Python is a venv of bullseye's own python3 made on /fsx (`--venv`): `hpc run` would otherwise name the
submitter's venv, which no node has.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import cli_json, run_hpc_process, wait_until
from testbench.faults import lost_node, restore_node
from testbench.layout import Layout
from toolkit.node.spares import PROBE_EVERY_VAR
from toolkit.rundir import RunDir

pytestmark = [pytest.mark.slurm]

# A user's training script: standard library only (the lane has no torch). Each step takes --step-seconds,
# `beat(step)` unless --no-beat, and a checkpoint (the step, the host) after every step that a restart resumes from;
# rank 1 never returns from step --hang-at.
SCRIPT = """\
import argparse, json, os, socket, time
p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=5)
p.add_argument("--step-seconds", type=float, default=0.2)
p.add_argument("--hang-at", type=int, default=-1)
p.add_argument("--checkpoint")
p.add_argument("--no-beat", action="store_true")
a = p.parse_args()
if not a.no_beat:
    from hpc_node.heartbeat import beat
rank, host = int(os.environ["RANK"]), socket.gethostname()
start = 0
if a.checkpoint and os.path.exists(a.checkpoint):
    start = json.load(open(a.checkpoint))["step"]
    print(json.dumps({"event": "resumed", "step": start, "rank": rank, "host": host}), flush=True)
for step in range(start + 1, a.steps + 1):
    if step == a.hang_at and rank == 1:
        while True:
            time.sleep(1)
    time.sleep(a.step_seconds)
    if not a.no_beat:
        beat(step)
    if a.checkpoint and rank == 0:
        with open(a.checkpoint + ".tmp", "w") as f:
            json.dump({"step": step, "host": host}, f)
        os.replace(a.checkpoint + ".tmp", a.checkpoint)
print(json.dumps({"event": "end", "rank": rank, "host": host}), flush=True)
"""
HEARTBEAT_INTERVAL = "1"
# The spares supervisor's probe period (default 10 s): the lost node's test would wait up to that long before the
# probes (two 15 s timeouts on this lane) it is there to see; the period itself is unit-tested (tests/test_spares.py).
PROBE_EVERY = "2"


@pytest.fixture(scope="module")
def node_venv(node_lane):
    """A venv of the nodes' own python3 (standard library only), on the shared dir, made by a node."""
    path = node_lane.shared_dir / "tests" / f"node-venv-{uuid.uuid4().hex[:8]}"
    res = subprocess.run(["srun", "--nodes=1", "--time=1", "python3", "-m", "venv", "--without-pip", str(path)],
                         env=node_lane.env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    yield path
    shutil.rmtree(path, ignore_errors=True)


def hpc_run(node_lane, node_venv, shared_tmp: Path, *options: str, script_args: tuple[str, ...] = ()) -> dict:
    script = shared_tmp / "train.py"
    script.write_text(SCRIPT)
    res = run_hpc_process("run", str(script), "--executor", "sbatch", "--venv", str(node_venv), "--no-preflight",
                          "--env", f"HPC_HEARTBEAT_INTERVAL={HEARTBEAT_INTERVAL}", *options, "--json", "--",
                          *script_args, env=node_lane.env(), cwd=shared_tmp, timeout=300)
    assert res.returncode in (0, 1), res.stdout + res.stderr
    return cli_json(res)


def job_state(node_lane, job_id: str) -> str:
    res = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=node_lane.env(), capture_output=True,
                         text=True, timeout=60)
    return res.stdout.strip()


def log(run: RunDir, job_id: str) -> str:
    path = run.job_output(job_id)
    return path.read_text() if path else ""


def test_a_users_script_beats_from_the_staged_bundle(node_lane, node_venv, shared_tmp):
    job = hpc_run(node_lane, node_venv, shared_tmp, "--nodes", "2", "--wait", script_args=("--steps", "5"))
    run = RunDir(job["run_dir"])
    assert job["run_dir"].startswith("/fsx/") and job["state"] == "COMPLETED", log(run, job["job_id"])
    beats = run.heartbeats()
    assert len(beats) == 4 and {b.step for b in beats} == {5} and len({b.node for b in beats}) == 2
    assert {b.node for b in beats} <= {"c1", "c2", "c3"}


def test_the_hang_watchdog_ends_a_hung_job_naming_its_rank(node_lane, node_venv, shared_tmp):
    started = time.monotonic()
    job = hpc_run(node_lane, node_venv, shared_tmp, "--nodes", "1", "--hang-timeout", "4", "--wait",
                  script_args=("--steps", "1000", "--hang-at", "4"))
    run = RunDir(job["run_dir"])
    assert job["state"] == "CANCELLED" and time.monotonic() - started < 40, log(run, job["job_id"])
    hang = run.hang()
    assert hang is not None, log(run, job["job_id"])
    [stalled] = hang["stalled"]
    node = next(b.node for b in run.heartbeats() if b.rank == 1)
    assert (stalled["rank"], stalled["node"], stalled["step"]) == (1, node, 3)
    assert stalled["where"] == "train.py:19 in <module>"  # its stack, from the rank's own faulthandler
    assert f"hpc: hang: rank 1 on node {node}: step 3" in log(run, job["job_id"])


def run_through_a_lost_node(node_lane, node_venv, shared_tmp, *script_args: str) -> tuple[dict, RunDir, float]:
    """1 node + 1 spare: once the training node checkpointed step 3, lose it for real; wait for the job's end.
    Returns the submission, its run dir, and the seconds from the kill to the job's end."""
    checkpoint = shared_tmp / "checkpoint.json"
    job = hpc_run(node_lane, node_venv, shared_tmp, "--nodes", "1", "--spares", "1",
                  "--env", f"{PROBE_EVERY_VAR}={PROBE_EVERY}",
                  script_args=("--steps", "12", "--step-seconds", "0.5", "--checkpoint", str(checkpoint),
                               *script_args))
    run, layout = RunDir(job["run_dir"]), Layout.current("bullseye")
    lost = None
    try:
        state = wait_until(lambda: checkpoint.exists() and json.loads(checkpoint.read_text()), 120, "step 1")
        state = wait_until(lambda: (s := json.loads(checkpoint.read_text()))["step"] >= 3 and s, 60, "step 3")
        lost = state["host"]
        killed = time.monotonic()
        assert lost_node(lost, layout)
        wait_until(lambda: job_state(node_lane, job["job_id"]) in ("", "COMPLETING"), 120, "the job's end")
        took = time.monotonic() - killed
    finally:
        if lost:
            restore_node(lost, layout)
    wait_until(lambda: job_state(node_lane, job["job_id"]) == "", 60, "the job gone from the queue")
    ends = [json.loads(line.split(": ", 1)[1]) for line in log(run, job["job_id"]).splitlines()
            if '"event": "end"' in line]
    assert [e["host"] for e in ends] and all(e["host"] != lost for e in ends), log(run, job["job_id"])
    [restart, *_] = run.restarts()
    assert (restart["kind"], restart["nodes"]) == ("restart", [lost]) and restart["next_nodes"] != [lost]
    return job, run, took


# A beating job moved to its spare after a lost node: tests/test_spares_slurm.py on the default lane (the same
# supervisor from the same bundle); here the case only this lane's probe makes possible.
def test_a_lost_node_under_a_job_without_heartbeats_is_found_within_a_minute(node_lane, node_venv, shared_tmp):
    job, run, took = run_through_a_lost_node(node_lane, node_venv, shared_tmp, "--no-beat")
    assert run.heartbeats() == []
    [restart, *_] = run.restarts()
    assert restart["trigger"].startswith("probe: "), restart
    assert took < 60, f"kill -> completion {took:.1f} s"
    print(f"no heartbeats: kill -> completion {took:.1f} s")


def test_a_fault_on_one_lanes_node_reaches_only_that_lanes_jobs(node_lane, slurm_sandbox, shared_tmp):
    # Both lanes have a node c2, and `make test` runs their tests beside each other: lost_node/slow_node must find
    # the processes of this lane's c2 only (a kill on the default lane's c2 once ended the node lane's jobs there).
    from testbench.faults import node_processes

    lanes = {"bullseye": (Layout.current("bullseye"), node_lane.env()), "default": (Layout.current(),
                                                                                    slurm_sandbox.env())}
    jobs = {}
    for name, (_, env) in lanes.items():
        res = subprocess.run(["sbatch", "--parsable", "-w", "c2", "-N", "1", "-o", "/dev/null", "--chdir",
                              str(shared_tmp), "--wrap", f"exec sleep 3{len(jobs)}7"], env=env, capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        jobs[name] = res.stdout.strip().split(";")[0]
    try:
        def sleeps(name: str) -> list[str]:
            layout = lanes[name][0]
            return [Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1].decode()
                    for pid in node_processes("c2", layout)
                    if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep")]

        assert wait_until(lambda: sleeps("bullseye"), 30, "the node lane's sleep on c2") == ["307"]
        assert wait_until(lambda: sleeps("default"), 30, "the default lane's sleep on c2") == ["317"]
    finally:
        for name, (_, env) in lanes.items():
            subprocess.run(["scancel", jobs[name]], env=env, capture_output=True, timeout=30)
