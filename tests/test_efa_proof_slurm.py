"""Jobs that prove they used EFA: `hpc jobs status` tells which transport ran and flags sockets on an EFA queue.

Once on the real local Slurm (what only a real run shows: the run dir's fabric for an EFA queue and the rank logs
where Slurm put them): a queue declared as EFA (an EFA instance type with Efa: Enabled, on the local cpu
partition) runs a payload that prints NCCL's own INFO lines (copied from public NCCL issues; the local nodes have
no EFA or NCCL). The same status over EFA's lines reads a run dir written here (no Slurm needed for what it shows;
the line classification itself: tests/test_transport.py)."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from tests.conftest import cli_json, run_hpc, slurm_env, submit_json
from tests.jobhelpers import CLUSTER_CONFIG, write_recipe


SOCKETS = ("ip-172-31-12-210:45305:45305 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using "
           "internal implementation\nip-172-31-12-210:45305:45305 [0] NCCL INFO NET/Socket : Using "
           "[0]ens3:172.31.12.210<0>\nip-172-31-12-210:45305:45305 [0] NCCL INFO Using network Socket")
EFA = ("ip-10-216-179-87:417138:417176 [0] NCCL INFO NET/OFI Selected Provider is efa\n"
       "ip-10-216-179-87:417138:417176 [0] NCCL INFO Using network AWS Libfabric")


def efa_cluster(tmp_path):
    """The local cpu partition declared as c5n.18xlarge (EFA, no GPU) with EFA enabled."""
    config = copy.deepcopy(CLUSTER_CONFIG)
    queue = config["Scheduling"]["SlurmQueues"][0]
    queue["ComputeResources"] = [{"Name": "c5n", "InstanceType": "c5n.18xlarge", "MaxCount": 2,
                                  "Efa": {"Enabled": True}}]
    path = tmp_path / "efa-cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def nccl_printer(tmp_path, lines: str):
    return write_recipe(tmp_path, {
        "name": "nccl-lines", "description": "prints NCCL's INFO lines (a stand-in for NCCL)", "source": "tests",
        "launcher": {"kind": "binary", "program": "/bin/sh"}, "args": {"-c": f"printf '%s\\n' {json.dumps(lines)}"},
        # No pre-flight: the local nodes only stand in for EFA nodes, which the pre-flight would rightly refuse
        "resources": {"nodes": 1, "time": "00:05:00", "exclusive": False, "preflight": False}}, "nccl-lines.yaml")


@pytest.mark.slurm
def test_jobs_status_of_a_real_run_flags_sockets_on_an_efa_queue(slurm_sandbox, tmp_path):
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    result = submit_json(str(nccl_printer(tmp_path, SOCKETS)), "--cluster", str(efa_cluster(tmp_path)), "--queue",
                         "cpu", "--wait", env=env)
    assert result["state"] == "COMPLETED"
    meta = json.loads((tmp_path / "runs" / result["run_dir"].rsplit("/", 1)[1] / "metadata.json").read_text())
    assert meta["fabric"] == "modern"  # the queue really has EFA: jobs set up for it
    status = run_hpc("jobs", "status", result["job_id"], "--json", env=env)
    network = cli_json(status)["network"]
    assert network["transport"] == "tcp"
    assert status.returncode == 1 and "warning: the queue has EFA but NCCL used TCP sockets" in status.stderr
    assert "LD_LIBRARY_PATH" in network["problem"] and "NET/Socket" in network["evidence"]
    human = run_hpc("jobs", "status", result["job_id"], env=env)
    assert "network: TCP sockets" in human.stdout


@pytest.mark.parametrize("lines,label,problem", [(EFA, "EFA (aws-ofi-nccl)", None), (SOCKETS, "TCP sockets", True)])
def test_the_network_of_a_run_dir_on_an_efa_queue(tmp_path, lines, label, problem):
    """What `hpc jobs status` shows as network: read from the rank logs of a run dir like the real run's above."""
    from toolkit.reports.transport import run_network
    from toolkit.rundir import RunDir

    (tmp_path / "submitit").mkdir()
    (tmp_path / "metadata.json").write_text(json.dumps({"fabric": "modern"}))
    (tmp_path / "submitit" / "7_0_log.out").write_text(f"probe\n{lines}\n")
    found = run_network(RunDir(tmp_path)).to_json()
    assert found["label"] == label and (found["problem"] is not None) == bool(problem)
