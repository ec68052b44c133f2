"""The pre-flight on nodes unlike the submitter (the bullseye node lane: python3 3.9, none of this machine's venv,
checkout or home; tests/test_node_lane.py): the batch shell unpacks the node-side bundle into the run dir on /fsx
and runs it with the node's own python3, passing on healthy nodes and naming a node that cannot write the run dir
(the fault made for real in that node's mount namespace), which is then requeued without it. Before the node side
had its own room the batch shell ran `<submitter's venv>/bin/python -m toolkit.health.preflight`, which no node of
this lane has."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import cli_json, run_hpc, wait_until
from testbench.faults import missing_mount
from testbench.layout import Layout
from toolkit.rundir import RunDir

pytestmark = [pytest.mark.slurm]

RANK_SCRIPT = '''"""A user's script: stdlib only (the lane has no torch); prints what each rank runs on."""
import json, os, platform, sys
print(json.dumps({"rank": os.environ["RANK"], "node": platform.node(), "python": list(sys.version_info[:2]),
                  "executable": sys.executable}), flush=True)
'''


@pytest.fixture(scope="module")
def node_venv(node_lane):
    """A venv on /fsx made by a node's own python3 (no pip: bullseye's minimal root has no ensurepip), as a
    researcher keeps one for the job; the submitter's venv is nowhere on the nodes."""
    venv = node_lane.shared_dir / "envs" / "py39"
    if not (venv / "bin" / "python3").exists():
        res = subprocess.run(["sbatch", "--wait", "--parsable", "-N1", "-p", "cpu", "-o", "/dev/null",
                              "--wrap", f"python3 -m venv --without-pip {venv}"],
                             capture_output=True, text=True, env=node_lane.env(), timeout=120)
        assert res.returncode == 0, res.stderr
    assert (venv / "bin" / "python3").exists()
    return venv


def submit(node_lane, shared_tmp, venv, *extra: str) -> subprocess.CompletedProcess:
    script = shared_tmp / "ranks.py"
    script.write_text(RANK_SCRIPT)
    return run_hpc("run", str(script), "--nodes", "2", "--queue", "cpu", "--time", "5",
                   "--set", f"software.venv={venv}", "--wait", "--json", *extra,
                   env=node_lane.env(), cwd=shared_tmp)


def ranks_of(run_dir: str) -> list[dict]:
    lines = [line.split(": ", 1)[-1] for p in RunDir(run_dir).path.glob("*.out") for line in p.read_text().splitlines()]
    return [json.loads(line) for line in lines if line.startswith('{"rank"')]


def test_the_preflight_passes_on_nodes_with_only_their_own_python(node_lane, shared_tmp, node_venv):
    res = submit(node_lane, shared_tmp, node_venv)
    assert res.returncode == 0, res.stdout + res.stderr
    job = cli_json(res)
    # the rendered script, the default: nothing of hpc's on the nodes, whatever the job's venv holds (submitit's
    # node side could not run in this Python 3.9 venv without submitit: tests/test_node_contract.py)
    assert job["state"] == "COMPLETED" and job["executor"] == "sbatch"
    run = RunDir(job["run_dir"])
    [record] = run.preflights()
    assert record["action"] == "passed" and len(record["nodes"]) == 2
    bundles = list((run.path / ".hpc").glob("hpc-node-*.pyz"))
    assert len(bundles) == 1  # the code that ran, kept with the run
    ranks = ranks_of(job["run_dir"])
    assert sorted(r["rank"] for r in ranks) == ["0", "1", "2", "3"]
    assert {tuple(r["python"]) for r in ranks} == {(3, 9)} and all(r["executable"].startswith(str(node_venv))
                                                                     for r in ranks)


def test_a_node_that_cannot_write_the_run_dir_is_named_and_left_out(node_lane, shared_tmp, node_venv):
    """c2 loses the runs dir (an empty read-only file system over it in c2's own mount namespace); the job lands on
    c1 (its batch host) and c2, stops before any rank starts naming c2, and runs again without it."""
    layout = Layout.current("bullseye")
    runs = node_lane.shared_dir / "hpc-runs"
    runs.mkdir(exist_ok=True)
    with missing_mount("c2", runs, layout):
        res = submit(node_lane, shared_tmp, node_venv)
    assert res.returncode == 0, res.stdout + res.stderr
    job = cli_json(res)
    assert job["state"] == "COMPLETED" and job["requeues"] == 1
    assert f"job {job['job_id']}: pre-flight FAILED on c2: shared-fs: the run dir" in res.stderr
    failed, passed = RunDir(job["run_dir"]).preflights()
    assert list(failed["failed"]) == ["c2"] and failed["action"].startswith("requeued, excluding c2 (job ")
    assert passed["action"] == "passed" and "c2" not in passed["nodes"]
    assert {r["node"] for r in ranks_of(job["run_dir"])} == {"c1", "c3"}
    helper = failed["action"].split("(job ")[1].split()[0]
    wait_until(lambda: _state(node_lane, helper) in ("COMPLETED", ""), 60, "the exclude helper's end")


def _state(node_lane, job_id: str) -> str:
    res = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                         env=node_lane.env(), timeout=60)
    return res.stdout.strip() or "COMPLETED"
