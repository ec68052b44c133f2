"""End to end on the local Slurm: `hpc cluster doctor` on the cpu queue, and the `collectives` recipe rendered,
submitted with sbatch across 2 nodes and read by `hpc report nccl`."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.conftest import cli_json, REPO, run_hpc, slurm_env
from tests.test_sandbox_slurm import sacct_state

pytestmark = pytest.mark.slurm


def doctor(sandbox, *args: str) -> subprocess.CompletedProcess:
    return run_hpc("cluster", "doctor", *args, env=slurm_env(sandbox), timeout=180)


def test_doctor_on_the_cpu_queue_reports_both_nodes_honestly(slurm_sandbox):
    res = doctor(slurm_sandbox, "--cluster", str(slurm_sandbox.cluster_config), "--queue", "cpu", "--json")
    assert res.returncode == 0, res.stderr
    data = cli_json(res)
    assert data["ok"] and data["queue"]["name"] == "cpu"
    assert [n["node"] for n in data["nodes"]] == ["c1", "c2"]
    assert [n["facts"]["hostname"] for n in data["nodes"]] == ["c1", "c2"]  # each check ran on its own node
    for node in data["nodes"]:
        assert {c["name"]: c["status"] for c in node["checks"]} == {
            "efa": "absent", "ib_uverbs": "absent", "gpus": "absent", "gpu-health": "n/a", "hpus": "n/a",
            "fsx": "n/a", "nccl": "absent", "aws-ofi-nccl": "absent", "efa-stack": "n/a"}
    text = doctor(slurm_sandbox, "--cluster", str(slurm_sandbox.cluster_config), "--queue", "cpu", "--check-nodes", "1")
    assert text.returncode == 0, text.stderr
    table = text.stdout.splitlines()
    assert table[2].split() == ["NODE", "efa", "ib_uverbs", "gpus", "gpu-health", "hpus", "fsx", "nccl", "aws-ofi-nccl",
                                "efa-stack"]
    assert len([line for line in table if line.startswith(("c1 ", "c2 "))]) == 1
    assert "not needed: m5.xlarge has no EFA" in text.stdout and "ok: every node passed" in text.stdout


def test_doctor_fails_nodes_that_lack_what_their_queue_declares(slurm_sandbox, tmp_path):
    """The same nodes declared as EFA instances with FSx: every node FAILs with the fix, exit 1."""
    config = yaml.safe_load(slurm_sandbox.cluster_config.read_text())
    cpu = config["Scheduling"]["SlurmQueues"][0]
    cpu["ComputeResources"][0]["Instances"] = [{"InstanceType": "c5n.18xlarge"}]
    cpu["ComputeResources"][0]["Efa"] = {"Enabled": True}
    cpu["Tags"] = [t for t in cpu["Tags"] if t["Key"] != "hpc:efa-stack"]  # EFA instances default to modern
    config["SharedStorage"] = [{"Name": "fsx", "StorageType": "FsxLustre", "MountDir": "/fsx"}]
    path = tmp_path / "efa-cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    res = doctor(slurm_sandbox, "--cluster", str(path), "--queue", "cpu", "--json")
    assert res.returncode == 1, res.stderr
    data = cli_json(res)
    assert not data["ok"] and [n["node"] for n in data["nodes"]] == ["c1", "c2"]
    for node in data["nodes"]:
        checks = {c["name"]: c for c in node["checks"]}
        assert [checks[name]["status"] for name in ("efa", "ib_uverbs", "fsx")] == ["FAIL"] * 3
        assert "EFA installer" in checks["efa"]["fix"] and checks["fsx"]["detail"] == "/fsx is not mounted"
    usage = doctor(slurm_sandbox, "--cluster", str(path), "--queue", "cpu", "--check-nodes", "3")
    assert usage.returncode == 2 and "has 2 usable node(s)" in usage.stderr


def test_doctor_timeout_revokes_its_pending_request(slurm_sandbox, monkeypatch):
    from toolkit.errors import HpcError
    from toolkit.health.doctor import run_srun

    monkeypatch.setenv("SLURM_CONF", str(slurm_sandbox.slurm_conf))
    name = "hpc-doctor-timeout-test"
    with pytest.raises(HpcError, match="did not finish within 2 s"):
        run_srun(["srun", "--partition=cpu", "--begin=now+600", f"--job-name={name}", "true"], timeout=2)
    left = subprocess.run(["squeue", "--noheader", f"--name={name}", "--format=%i"], capture_output=True, text=True,
                          env=slurm_env(slurm_sandbox), timeout=30)
    assert left.returncode == 0 and left.stdout.strip() == ""  # SIGTERM made srun cancel it: nothing left queued


def test_collectives_recipe_runs_on_two_nodes_and_hpc_report_nccl_reads_it(slurm_sandbox, tmp_path):
    script = tmp_path / "collectives.sbatch"
    res = run_hpc("recipes", "render", "collectives", "--nodes", "2", "--cluster", str(slurm_sandbox.cluster_config),
                  "--queue", "cpu", "--profile", "smoke", "--set", f"software.venv={sys.prefix}",
                  "--set", f"dirs.root={tmp_path}", "--set", f"env.PYTHONPATH={REPO}", "-o", str(script),
                  "--run-dir", str(tmp_path / "runs" / "collectives-smoke"))
    assert res.returncode == 0, res.stderr
    run_dir = tmp_path / "runs" / "collectives-smoke"
    run_dir.mkdir(parents=True)  # the script's own note: Slurm does not create the log directory
    submit = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, cwd=tmp_path,
                            env=slurm_env(slurm_sandbox), timeout=30)
    assert submit.returncode == 0, submit.stderr
    job_id = submit.stdout.strip().split(";")[0]
    # sbatch --parsable and polling, not `sbatch --wait`: on Slurm 22.05 that checks after 2, 10 and 42 s, so a
    # job of 11 s returns after 42
    state = sacct_state(slurm_sandbox, job_id, timeout=120)
    log = run_dir / f"collectives-smoke-{job_id}.out"
    assert state == "COMPLETED", log.read_text()[-3000:] if log.exists() else state

    report = run_hpc("report", "nccl", str(log), "--json")
    assert report.returncode == 0, report.stderr
    data = cli_json(report)
    assert data["status"] == "NO-VERDICT"
    assert [t["test"] for t in data["tests"]] == ["all_reduce", "all_gather", "reduce_scatter"]
    for test in data["tests"]:
        assert (test["ranks"], test["nodes"], test["wrong_values"], test["out_of_bounds"]) == (4, 2, 0, 0)
        assert test["max_busbw_gbs"] > 0 and test["verdict"]["reason"].startswith("no instance type given")
    assert [r["size"] for r in data["tests"][0]["rows"]] == [8 * 8 ** k for k in range(6)]
    # with an instance type the floor rules apply: a 2-node run, but messages far under the floor's 256 MiB
    judged = cli_json(run_hpc("report", "nccl", str(log), "--json", "--instance", "p3dn.24xlarge",
                                "--transport", "tcp"))
    reduce = judged["tests"][0]["verdict"]
    assert reduce["status"] == "NO-VERDICT" and "under the floor's smallest measured size, 256 MiB" in reduce["reason"]
    text = run_hpc("report", "nccl", str(log)).stdout
    assert "ranks=4 nodes=2" in text and "overall: NO-VERDICT" in text
