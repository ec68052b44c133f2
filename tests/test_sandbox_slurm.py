"""The local test cluster for real: jobs across its two nodes, accounting, the p3dn shape, up/down/refusal."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, run_testbench, slurm_env, wait_until
from testbench import cluster, discover, procs
from testbench.layout import Layout
from toolkit.errors import HpcError

pytestmark = pytest.mark.slurm
PAYLOADS = Path(__file__).parent / "payloads"


def slurm(sandbox, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, env=slurm_env(sandbox), timeout=timeout)


def sacct_state(sandbox, job_id: str, timeout: float = 20) -> str:
    """The job's accounting state once it is final (sacct lags squeue by up to a second)."""
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = slurm(sandbox, "sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State").stdout.strip()
        if state and state not in ("PENDING", "RUNNING", "COMPLETING"):
            return state
        time.sleep(0.3)
    return state


def wait_until_idle(sandbox, timeout: float = 120) -> None:
    """Restart tests wait for other tests' jobs to finish first: the cluster is shared (never restart it under
    a running job: fail instead)."""
    def idle() -> bool:
        res = slurm(sandbox, "squeue", "-h", "-o", "%i")
        return res.returncode == 0 and not res.stdout.strip()

    wait_until(idle, timeout, "the local cluster to have no jobs", poll_s=1)


def test_srun_places_two_ranks_on_each_named_node(slurm_sandbox):
    res = slurm(slurm_sandbox, "srun", "-N2", "--ntasks-per-node=2", "--cpus-per-task=1", "sh", "-c",
                'echo "$SLURM_PROCID $(hostname) $SLURM_LOCALID $SLURM_NODEID"')
    assert res.returncode == 0, res.stderr
    rows = sorted(line.split() for line in res.stdout.splitlines())
    assert rows == [["0", "c1", "0", "0"], ["1", "c1", "1", "0"], ["2", "c2", "0", "1"], ["3", "c2", "1", "1"]]


def test_ranks_rendezvous_across_nodes_and_accounting_records_the_job(slurm_sandbox):
    res = slurm(slurm_sandbox, "srun", "-N2", "--ntasks-per-node=2", "--cpus-per-task=1",
                sys.executable, str(PAYLOADS / "rendezvous.py"))
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert (out["master"], out["master_addr"]) == ("c1", "127.0.1.11")
    assert out["self"] == {"rank": 0, "host": "c1", "localid": 0, "nodeid": 0}
    assert [(p["rank"], p["host"], p["localid"], p["nodeid"]) for p in out["peers"]] == [
        (1, "c1", 1, 0), (2, "c2", 0, 1), (3, "c2", 1, 1)]
    assert sacct_state(slurm_sandbox, out["job_id"]) == "COMPLETED"


@pytest.mark.training
def test_gloo_all_reduce_spans_four_ranks_on_two_nodes(slurm_sandbox):
    res = slurm(slurm_sandbox, "srun", "-N2", "--ntasks-per-node=2", "--cpus-per-task=1",
                "--export=ALL,OMP_NUM_THREADS=1", sys.executable, str(PAYLOADS / "allreduce.py"), timeout=300)
    assert res.returncode == 0, res.stderr
    ranks = sorted((json.loads(line) for line in res.stdout.splitlines()), key=lambda r: r["rank"])
    assert [(r["rank"], r["host"], r["world"], r["sum"]) for r in ranks] == [
        (0, "c1", 4, 10.0), (1, "c1", 4, 10.0), (2, "c2", 4, 10.0), (3, "c2", 4, 10.0)]


def test_p3dn_shaped_job_passes_test_only(slurm_sandbox):
    res = slurm(slurm_sandbox, "sbatch", "--test-only", "-p", "p3dn", "-N", "8", "--ntasks-per-node", "8",
                "--gpus-per-node", "8", "--cpus-per-task", "12", "--exclusive", "--wrap", "true")
    assert res.returncode == 0, res.stderr
    assert "p3dn-st-p3dn-24xl-[1-8] in partition p3dn" in res.stderr


def test_p3dn_rejects_what_a_p3dn_node_cannot_hold(slurm_sandbox):
    # The controller's own verdict (a controller that does not answer fails too, with another message), and
    # the same job with 8 GPUs, what a node has, is accepted.
    def gpus(n: int) -> subprocess.CompletedProcess:
        return slurm(slurm_sandbox, "sbatch", "--test-only", "-p", "p3dn", "-N", "1", "--gpus-per-node", str(n),
                     "--wrap", "true")

    res = gpus(9)
    assert res.returncode != 0 and "Requested node configuration is not available" in res.stderr, res.stderr
    assert gpus(8).returncode == 0


def test_second_up_is_a_fast_no_op(slurm_sandbox):
    res = run_testbench("up", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["started"] == [] and data["installed"] == []
    assert data["seconds"] < 2.0
    assert data["slurm_conf"] == str(slurm_sandbox.slurm_conf) and data["default_queue"] == "cpu"


def test_env_points_slurm_and_hpc_at_the_cluster_as_a_user_would(slurm_sandbox, tmp_path):
    # A shell with no cluster settings: after `eval "$(python -m testbench env)"` Slurm's commands reach the
    # controller and hpc takes its queues from the cluster's config, as on a real cluster's login node.
    clean = {k: v for k, v in slurm_env(slurm_sandbox).items() if k not in ("SLURM_CONF", "HPC_CLUSTER_CONFIG")}
    script = (f'exports="$({shlex.quote(sys.executable)} -m testbench env)" && eval "$exports" && scontrol ping && '
              f"{shlex.quote(sys.executable)} -m toolkit recipes render collectives --nodes 2")
    res = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=clean, cwd=REPO, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "is UP" in res.stdout and "#SBATCH --partition=cpu" in res.stdout
    assert f"queue cpu (m5.xlarge) from {slurm_sandbox.cluster_config}" in res.stderr, res.stderr


def test_status_reports_every_daemon_and_node(slurm_sandbox):
    res = run_testbench("status", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["up"] is True
    assert {d["name"] for d in data["daemons"]} == {
        "munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd-c1", "slurmd-c2",
        *(f"slurmd-w{i}" for i in range(1, 17))}
    assert data["nodes"]["c1"] in ("idle", "mix", "alloc") and data["nodes"]["p3dn-st-p3dn-24xl-8"] == "idle~"


def test_up_refuses_when_slurm_runs_that_this_state_dir_did_not_start(slurm_sandbox, tmp_path):
    # The running sandbox is foreign to another state dir: `up` there must refuse before touching anything.
    other = tmp_path / "other-sandbox"
    res = run_testbench("up", env={**slurm_env(slurm_sandbox), "HPC_SANDBOX_DIR": str(other)})
    assert res.returncode == 1
    assert "another Slurm or munge runs on this machine" in res.stderr and "slurmctld (pid" in res.stderr
    assert "fix:" in res.stderr and not other.exists()


def test_refusal_names_a_stray_daemon_beside_our_own(slurm_sandbox, tmp_path):
    # A harmless process of our own that merely carries a Slurm daemon's name.
    fake = tmp_path / "slurmctld"
    shutil.copy("/bin/sleep", fake)
    stray = subprocess.Popen([str(fake), "60"])
    try:
        procs.wait_for(lambda: procs.comm(stray.pid) == "slurmctld", 5, "fake slurmctld")
        with pytest.raises(HpcError, match=rf"slurmctld \(pid {stray.pid}\)") as err:
            cluster.refuse_foreign(Layout(slurm_sandbox.state_dir))
        assert "munged" not in str(err.value)  # our own munged is not foreign
    finally:
        stray.kill()
        stray.wait()


def test_half_dead_cluster_is_repaired(slurm_sandbox):
    layout = Layout(slurm_sandbox.state_dir)
    wait_until_idle(slurm_sandbox)
    assert procs.stop(layout.pid_file("slurmd", "c2"), "slurmd")
    res = run_testbench("up", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["started"] == ["slurmd-c2"]
    assert sorted(slurm(slurm_sandbox, "srun", "-N2", "hostname").stdout.split()) == ["c1", "c2"]


def test_down_stops_everything_by_pid_file_and_up_starts_it_again(slurm_sandbox):
    layout = Layout(slurm_sandbox.state_dir)
    wait_until_idle(slurm_sandbox)
    before = cluster.running(layout)
    res = run_testbench("down", "--json")
    assert res.returncode == 0, res.stderr
    assert set(json.loads(res.stdout)["stopped"]) == set(before)
    assert all(not procs.alive(before[d.key], d.comm) for d in cluster.daemons(layout))
    assert discover() is None
    assert run_testbench("status").returncode == 1

    res = run_testbench("up", "--json", timeout=300)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["started"] == list(before)
    assert discover() == slurm_sandbox
    assert sorted(slurm(slurm_sandbox, "srun", "-N2", "hostname").stdout.split()) == ["c1", "c2"]
