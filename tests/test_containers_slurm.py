"""Jobs in containers on the real local Slurm: the container lane (`python -m testbench up --slurm 22.05-pyxis`:
NVIDIA pyxis and enroot built from the pinned sources, testbench/containers.py) runs every rank of a job inside a
squashfs image made with debootstrap, 2 nodes x 2 ranks; the default lane, which has no pyxis, refuses such a job.

The image has Python but no torch: the jobs mount this machine's Python, its venv and this checkout (as users
mount an environment kept on FSx) and activate the venv inside (software.venv). Its /etc/environment sets
MASTER_ADDR to an address nothing answers, and enroot's 50-slurm-pytorch.sh hook (enabled on the lane's nodes)
writes its own MASTER_PORT: the ranks rendezvous only because the job passes its own with --container-env.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CLEAN_RUN_LINE, REPO, cli_json, run_hpc, run_testbench, slurm_env, wait_until
from toolkit.job.rank import master_port
from toolkit.workloads.train_log import read_log

pytestmark = [pytest.mark.slurm, pytest.mark.training]
LANE = "22.05-pyxis"
TIMEOUT = 600


@pytest.fixture(scope="module")
def container_lane():
    """The container lane, up (cached: a few seconds); skipped with one line where its sources are absent."""
    from testbench import containers, discover
    from testbench.layout import Layout

    if containers.find_sources() is None:
        pytest.skip(containers.missing_sources())
    res = run_testbench("up", "--slurm", LANE, "--json", timeout=900)
    assert res.returncode == 0, f"python -m testbench up --slurm {LANE} failed:\n{res.stderr}"
    return discover(Layout.current(LANE)), containers.image_path()


def host_mounts(tmp_path: Path) -> list[str]:
    """What the ranks need from this machine: its Python, the venv, torch's site-packages, this checkout, the
    test's own dir (runs, data). Nested paths are left to their parent's mount."""
    import torch

    paths = sorted({sys.prefix, sys.base_prefix, str(Path(torch.__file__).parents[1]), str(REPO), str(tmp_path)})
    return [p for p in paths if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in paths)]


def test_resnet_smoke_in_a_container_2x2_stops_on_usr2_requeues_and_resumes(container_lane, tmp_path):
    """The rendered script (executor sbatch): its batch shell on the host, every rank in the container. SIGUSR2 to
    the batch shell (what --signal=B:USR2 sends before the time limit) reaches the containerized ranks through
    srun; they stop at an agreed step and save, the job requeues, and the rerun resumes from that step."""
    sandbox, image = container_lane
    env = dict(sandbox.env(), HPC_RUNS_DIR=str(tmp_path / "runs"))
    sets = [f"software.container.image={image}", f"software.container.mounts={json.dumps(host_mounts(tmp_path))}",
            f"software.venv={sys.prefix}", "env.PYTHONPATH=" + str(REPO), "args.--max-steps=10",
            "args.--log-every-steps=1", "args.--checkpoint-every-steps=100"]
    res = run_hpc("recipes", "submit", "resnet50", "--profile", "smoke", "--nodes", "2", "--executor", "sbatch",
                  *(w for s in sets for w in ("--set", s)), "--json", env=env, cwd=tmp_path, timeout=TIMEOUT)
    assert res.returncode == 0, res.stderr
    job = cli_json(res)
    run, job_id = Path(job["run_dir"]), job["job_id"]
    log = run / "logs" / "train_log.jsonl"

    def steps() -> list[dict]:
        return [r for r in read_log(log) if r["event"] == "train"] if log.exists() else []
    wait_until(lambda: len(steps()) >= 3, TIMEOUT, "resnet step 3 in the container")
    subprocess.run(["scancel", "--signal=USR2", "--batch", job_id], env=env, check=True, timeout=30)
    # The rerun starts once the first run's job credential has expired (AuthInfo=cred_expire=5 on the lanes):
    # starting it earlier (scontrol update StartTime=now) was seen to kill it ("Job credential revoked").

    def ended():
        records = read_log(log)
        return records if records[-1]["event"] == "end" and records[-1]["status"] == "max_steps" else None
    records = wait_until(ended, TIMEOUT, "the requeued job to finish")
    starts = [r for r in records if r["event"] == "start"]
    stopped = [r for r in records if r["event"] == "end" and r["status"] == "stopped"]
    assert len(starts) == 2 and len(stopped) == 1
    assert starts[1]["resumed_from_step"] == stopped[0]["step"] >= 3
    out = next(run.glob("resnet50-smoke-*.out")).read_text()
    assert "hpc: stop requested: requeueing job" in out
    assert f"rendezvous c1:{master_port(int(job_id))}" in out

    logs = run_hpc("jobs", "logs", job_id, "--rank", "3", env=env, cwd=tmp_path)
    assert logs.returncode == 0 and "world_size 4" in logs.stdout
    report = run_hpc("report", "run", str(run), "--json", *CLEAN_RUN_LINE, env=env)
    assert report.returncode == 0, report.stdout + report.stderr
    losses = [loss for _step, loss in cli_json(report)["training"]["loss_curve"]]
    assert len(losses) >= 10 and sum(losses[-3:]) < sum(losses[:3])


def test_a_tutorial_script_runs_in_the_container_with_the_jobs_rendezvous(container_lane, tmp_path):
    """`hpc run --container` (submitit): recipes/examples/ddp_train.py, 2 nodes x 2 ranks, each rank in the image
    (its /tmp is the container's own: the checkpoints written there never reach this machine's) with the job's
    MASTER_ADDR and
    MASTER_PORT over the image's and enroot's hook's."""
    sandbox, image = container_lane
    env = dict(sandbox.env(), HPC_RUNS_DIR=str(tmp_path / "runs"))
    inside = Path("/tmp") / f"hpc-container-test-{tmp_path.name}"  # on the container's own tmpfs
    mounts = [w for m in host_mounts(tmp_path) for w in ("--container-mount", m)]
    res = run_hpc("run", str(REPO / "recipes" / "examples" / "ddp_train.py"), "--nodes", "2", "--queue", "cpu",
                  "--executor", "slurm", "--time", "00:10:00", "--venv", sys.prefix, "--env", f"PYTHONPATH={REPO}",
                  "--container", str(image), *mounts, "--wait", "--json", "--", "--steps", "20", "--checkpoint-every",
                  "10", "--checkpoint-dir", str(inside), env=env, cwd=tmp_path, timeout=TIMEOUT)
    assert res.returncode == 0, res.stderr
    result = cli_json(res)
    assert result["state"] == "COMPLETED" and result["ranks"] == 4
    run = Path(result["run_dir"])
    lines = [json.loads(ln) for p in sorted((run / "submitit").glob("*_log.out"))
             for ln in p.read_text().splitlines() if ln.startswith("{")]
    seen = {r["rank"]: r for r in lines if r.get("event") == "rank_env"}
    assert sorted(seen) == [0, 1, 2, 3]
    for rank, r in seen.items():
        assert r["env"]["MASTER_ADDR"] == "c1" and r["env"]["MASTER_PORT"] == str(master_port(int(result["job_id"])))
        assert r["env"]["RANK"] == str(rank) and r["env"]["WORLD_SIZE"] == "4"
        assert r["host"] == f"c{rank // 2 + 1}"  # enroot keeps the node's UTS namespace
    assert not inside.exists()  # the checkpoints went to the container's /tmp
    report = run_hpc("report", "run", str(run), "--json", env=env)
    losses = [loss for _step, loss in cli_json(report)["training"]["loss_curve"]]
    assert losses[-1] < losses[0]


def test_the_doctor_reports_pyxis_and_starts_the_image_on_every_node(container_lane):
    sandbox, image = container_lane
    res = run_hpc("cluster", "doctor", "--queue", "cpu", "--container-image", str(image), "--json",
                  env=sandbox.env(), timeout=120)
    containers = cli_json(res)["containers"]
    assert containers["pyxis"] and containers["started"] == ["c1", "c2"] and containers["error"] is None


def test_a_container_job_is_refused_on_a_lane_without_pyxis(slurm_sandbox, tmp_path):
    """The default lane loads no pyxis: the job is refused before anything is written or sent, with the fix."""
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"))
    res = run_hpc("run", str(REPO / "recipes" / "examples" / "ddp_train.py"), "--nodes", "2", "--queue", "cpu",
                  "--container", "/fsx/images/train.sqsh", "--json", env=env, cwd=tmp_path)
    assert res.returncode == 1 and "pyxis is not loaded" in res.stderr and "--pyxis" in res.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # no run dir: nothing sent
    # what the doctor reports there (its probe alone: the node checks are the doctor's own tests')
    from toolkit.cluster.queues import load_queues
    from toolkit.health.doctor import check_containers

    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        check = check_containers(load_queues(slurm_sandbox.cluster_config)["cpu"], 1, None, None, 60)
    assert not check.pyxis and "no --container-image" in check.error
