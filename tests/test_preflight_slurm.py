"""The pre-flight on the local Slurm (toolkit.node.preflight), with a fault made for real: node w2 of the `wide`
partition loses the shared file system the run dir is on (testbench.faults.missing_mount: an empty read-only file
system over it in w2's own mount namespace, which its steps inherit). A 2-node training job that lands on w1 and
w2 stops before any rank starts, names w2 and the check, is requeued held, and its hpc-exclude helper adds w2 to
its ExcNodeList and releases it: it then runs on two other nodes and completes. Every other E2E training job of
the suite runs the pre-flight too and must pass it (the clean runs: no false alarm)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, cli_json, run_hpc, slurm_env, wait_until
from tests.jobhelpers import goodput_ledger
from testbench.faults import missing_mount
from toolkit.rundir import RunDir

pytestmark = [pytest.mark.slurm]
PRINT_ENV = REPO / "tests" / "payloads" / "print_env.py"
# the local cluster's cpu queue (m5.xlarge), as the planner resolves it: toolkit.node.promise's fields
CPU_PROMISE = {"accelerator": "none", "efa_interfaces": 0, "efa_stack": "none", "fabric": "none", "fsx_mount": None,
               "gpu_model": None, "gpus": 0, "instance_type": "m5.xlarge", "plugin_dirs": [],
               "proprietary_driver": False, "queue": "cpu"}


def test_a_node_without_the_shared_file_system_is_named_and_the_job_requeued_without_it(slurm_sandbox, tmp_path):
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    # w1 and w2 are the partition's first idle nodes: the job lands on them, and the batch host w1 keeps its view
    with missing_mount("w2", tmp_path):
        res = run_hpc("run", str(PRINT_ENV), "--nodes", "2", "--queue", "wide", "--time", "5", "--executor", "slurm",
                      "--wait", "--json", env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    job = cli_json(res)
    assert job["state"] == "COMPLETED" and job["requeues"] == 1
    assert f"job {job['job_id']}: pre-flight FAILED on w2: shared-fs: the run dir" in res.stderr
    assert "; requeued, excluding w2 (job " in res.stderr

    records = RunDir(job["run_dir"]).preflights()
    assert [r["job"] for r in records] == [job["job_id"]] * 2
    failed, passed = records
    assert failed["nodes"] == ["w1", "w2"] and list(failed["failed"]) == ["w2"]
    assert [c["name"] for c in failed["failed"]["w2"]] == ["shared-fs"]
    assert f"the run dir {job['run_dir']} cannot be written from this node" in failed["failed"]["w2"][0]["detail"]
    assert failed["action"].startswith("requeued, excluding w2 (job ")
    assert passed["action"] == "passed" and "w2" not in passed["nodes"] and passed["seconds"] < 30

    # the job's log says it in one line, then the clean start; no rank ran on the first allocation
    log = "".join(p.read_text() for p in RunDir(job["run_dir"]).path.glob("submitit/*_0_log.out"))
    assert f"hpc: pre-flight: FAILED on w2: shared-fs: the run dir {job['run_dir']}" in log
    assert "hpc: pre-flight: 2 node(s) passed" in log
    ranks = [json.loads(line) for p in RunDir(job["run_dir"]).path.glob("submitit/*_log.out")
             for line in p.read_text().splitlines() if line.startswith('{"env"')]
    assert sorted(r["env"]["RANK"] for r in ranks) == ["0", "1"]

    status = run_hpc("jobs", "status", job["job_id"], env=env)
    assert f"pre-flight: FAILED on w2: shared-fs: the run dir {job['run_dir']}" in status.stdout
    assert "then: requeued, excluding w2" in status.stdout and "pre-flight: passed on 2 node(s)" in status.stdout
    shown = cli_json(run_hpc("jobs", "status", job["job_id"], "--json", env=env))
    assert [r["action"] for r in shown["preflight"]] == [failed["action"], "passed"]

    # The goodput ledger: its parts add up to Slurm's wall time; both pre-flights and the requeue between them
    ledger = goodput_ledger(job["run_dir"], env, job["job_id"])
    kinds = [s["kind"] for s in ledger["segments"]]
    assert kinds[:4] == ["queue", "preflight", "requeue", "preflight"], kinds
    assert ledger["seconds"]["preflight"] == pytest.approx(failed["seconds"] + passed["seconds"], abs=0.01)
    assert any("a step log" in m for m in ledger["missing"])  # print_env.py logs no steps: named, unattributed

    helper = failed["action"].split("(job ")[1].split()[0]
    wait_until(lambda: _state(slurm_sandbox, helper) == "COMPLETED", 60, "the exclude helper's end")


def _state(sandbox, job_id: str) -> str:
    res = subprocess.run(["sacct", "-n", "-X", "-j", job_id, "-o", "State"], capture_output=True, text=True,
                         env=slurm_env(sandbox), timeout=60)
    return res.stdout.strip()


def test_a_benchmark_whose_node_fails_ends_with_status_1_before_any_rank_starts(slurm_sandbox, tmp_path):
    """The ranks' step starts beside the pre-flight and its ranks wait at the gate (toolkit.node.gate). A job that
    is not requeued (resources.requeue: false) and loses w2's shared file system: the pre-flight names w2 and the
    batch shell ends the job at once, with status 1, the ranks waiting at the gate ended with it; none started
    its workload, on w2 or on w1, which passed. Through the rendered script (the requeue test above is submitit's)."""
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    with missing_mount("w2", tmp_path):
        res = run_hpc("run", str(PRINT_ENV), "--nodes", "2", "--queue", "wide", "--time", "5", "--executor", "sbatch",
                      "--set", "resources.requeue=false", "--preflight", "--wait", "--json", env=env, cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    job = cli_json(res)
    assert job["state"] == "FAILED" and job["requeues"] == 0
    [record] = RunDir(job["run_dir"]).preflights()
    assert list(record["failed"]) == ["w2"] and record["action"] == "stopped: a benchmark is not requeued"
    log = "".join(p.read_text() for p in RunDir(job["run_dir"]).path.glob("*.out"))
    assert f"FAILED on w2: shared-fs: the run dir {job['run_dir']}" in log
    assert '{"env"' not in log  # no rank ran its workload, on either node
    sacct = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job["job_id"], "-o", "ExitCode,ElapsedRaw"],
                           capture_output=True, text=True, env=slurm_env(slurm_sandbox), timeout=60).stdout.split("|")
    assert sacct[0] == "1:0" and int(sacct[1]) < 60, sacct  # the batch shell's own status, not the gate's 600 s


def test_the_node_steps_two_checks_run_on_a_cpu_each_where_the_job_has_two(slurm_sandbox, tmp_path):
    """The pre-flight's node step as its driver builds it inside a job of 2 nodes x 2 ranks x 1 CPU (the
    benchmark's shape; SLURM_CPUS_PER_TASK=1 in its environment), each check's source swapped for a probe that
    prints the CPUs its process may run on. The local cluster confines steps to their CPUs (ConstrainCores, as
    ParallelCluster's cgroup.conf): with one CPU per task the node check and the loader check, meant to run at
    once, took turns on one CPU."""
    probe = ("import json, os, sys; print(json.dumps({'node': os.environ['SLURMD_NODENAME'], 'check': %r, "
             "'cpus': len(os.sched_getaffinity(0))}))")
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import os, subprocess, sys\n"
        "from toolkit.node import preflight, slurm\n"
        "from toolkit.node.promise import Promise\n"
        f"promise = Promise.from_json({json.dumps(json.dumps(CPU_PROMISE))})\n"
        "argv = preflight.step_argv(int(os.environ['SLURM_JOB_NUM_NODES']), sys.argv[1], promise,\n"
        "                           ['--library', 'libc.so.6'], '',\n"
        "                           slurm.cpus_per_node(os.environ['SLURM_JOB_CPUS_PER_NODE']))\n"
        "at = argv.index('bash')\n"
        f"argv[at + 4:at + 6] = [{probe % 'node'!r}, {probe % 'loader'!r}]\n"
        "sys.exit(subprocess.run(argv).returncode)\n")
    env = dict(slurm_env(slurm_sandbox), PYTHONPATH=str(REPO))
    res = subprocess.run(["sbatch", "--wait", "--partition=cpu", "--nodes=2", "--ntasks-per-node=2",
                          "--cpus-per-task=1", f"--output={tmp_path}/out-%j.txt", "--wrap",
                          f"{sys.executable} {driver} {tmp_path}"], capture_output=True, text=True, env=env,
                         timeout=120)
    out = "".join(p.read_text() for p in tmp_path.glob("out-*.txt"))
    assert res.returncode == 0, res.stderr + out
    lines = sorted((r["node"], r["check"], r["cpus"]) for r in map(json.loads, out.splitlines()))
    assert lines == [("c1", "loader", 2), ("c1", "node", 2), ("c2", "loader", 2), ("c2", "node", 2)]
