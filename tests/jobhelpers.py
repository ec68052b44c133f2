"""Queues and recipe files the recipe/job tests share."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import yaml

from toolkit.cluster.queues import Queue, default_queue

P3DN = default_queue()
CPU = Queue(name="cpu", instance_type="m5.xlarge", max_nodes=2, efa_stack="none", ranks_per_node=2,
            cpus_per_task_override=1)

CLUSTER_CONFIG = {
    "Region": "us-east-1",
    "Scheduling": {"Scheduler": "slurm", "SlurmQueues": [
        {"Name": "cpu", "ComputeResources": [{"Name": "cpu", "InstanceType": "m5.xlarge", "MaxCount": 2}],
         "Tags": [{"Key": "hpc:ranks-per-node", "Value": "2"}, {"Key": "hpc:cpus-per-task", "Value": "1"}]},
        {"Name": "gaudi", "ComputeResources": [{"Name": "dl1", "InstanceType": "dl1.24xlarge", "MaxCount": 4}]},
        {"Name": "p3", "ComputeResources": [{"Name": "p3", "InstanceType": "p3.16xlarge", "MaxCount": 4}]},
    ]},
    "SharedStorage": [{"MountDir": "/shared", "Name": "fsx", "StorageType": "FsxLustre"}],
}

MINIMAL_RECIPE = {
    "name": "mini",
    "description": "a small valid recipe",
    "source": "tests",
    "launcher": {"kind": "fairseq"},
    "args": {"--arch": "transformer", "--max-sentences": 4, "--fp16": True},
    "resources": {"nodes": 1, "time": "01:00:00"},
    "dirs": {"data": {"dir": "data", "arg": "positional"}},
    "scaling": {"--update-freq": {"rule": "accumulate", "per_rank_arg": "--max-sentences", "global_batch": 64,
                                  "why": "keep the global batch"}},
}


def write_cluster(directory: Path) -> Path:
    path = directory / "cluster.yaml"
    path.write_text(yaml.safe_dump(CLUSTER_CONFIG))
    return path


def write_recipe(directory: Path, data: dict, name: str = "recipe.yaml") -> Path:
    path = directory / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def parse_flags(argv: list[str]) -> dict[str, list[str]]:
    """argv -> {flag: [values]} (a word starting with '-' and not a number starts a flag)."""
    flags: dict[str, list[str]] = {}
    current = None
    for word in argv:
        if word.startswith("-") and not word.lstrip("-").replace(".", "").isdigit():
            current = word
            flags[current] = []
        elif current is not None:
            flags[current].append(word)
    return flags


REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "tests" / "payloads" / "probe.py"
HOSTILE = "it's $(touch {canary}) `touch {canary}`; \"x\" \n y"


def probe_recipe(tmp_path: Path, **env: str) -> Path:
    """A recipe whose ranks record their argv and environment (tests/payloads/probe.py) under tmp_path/probe."""
    canary = tmp_path / "canary"
    recipe = {
        "name": "probe", "description": "records each rank's argv and environment", "source": "tests",
        "launcher": {"kind": "binary", "program": str(PROBE)},
        "args": {"--text": HOSTILE.format(canary=canary), "--count": 3, "--flag": True},
        # No pre-flight: its tests submit with write_cluster's config, whose FSx at /shared the local nodes lack
        # (the pre-flight would rightly stop the job: tests/test_preflight_slurm.py).
        "resources": {"nodes": 2, "time": "00:05:00", "preflight": False},
        "env": {"PROBE_OUT": str(tmp_path / "probe"), **env},
    }
    return write_recipe(tmp_path, recipe, "probe.yaml")


def read_ranks(out: Path) -> dict[int, dict]:
    """What each probe rank recorded, by rank (the files are removed, so the next run starts clean)."""
    ranks = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in out.glob("rank-*.json")}
    for p in out.glob("rank-*.json"):
        p.unlink()
    return ranks


def one_rank_cluster(sandbox, tmp_path: Path) -> Path:
    """The local test cluster's config with its cpu queue at 1 rank per node (1 CPU): 4 such jobs fit at once."""
    config = yaml.safe_load(Path(sandbox.cluster_config).read_text())
    for queue in config["Scheduling"]["SlurmQueues"]:
        for tag in queue.get("Tags") or []:
            if tag["Key"] == "hpc:ranks-per-node":
                tag["Value"] = "1"
    path = tmp_path / "cluster-1rank.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def sweep_probe_recipe(tmp_path: Path, **env: str) -> Path:
    """The probe as 1-node jobs that share nodes (tasks of a sweep): ranks write task-<ARRAY>_<T>-rank-<R>.json.

    PYTHONPATH: the nodes' submitit unpickles the launcher with this checkout's toolkit (not the venv's install).
    """
    recipe = {
        "name": "probe", "description": "records each rank's argv and environment", "source": "tests",
        "launcher": {"kind": "binary", "program": str(PROBE)},
        "args": {"--count": 0},
        # No pre-flight, as probe_recipe (write_cluster's FSx at /shared)
        "resources": {"nodes": 1, "time": "00:05:00", "exclusive": False, "preflight": False},
        "env": {"PROBE_OUT": str(tmp_path / "probe"), "PYTHONPATH": str(REPO), **env},
    }
    return write_recipe(tmp_path, recipe, "probe.yaml")


def kubelet_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of a container's args (k8s.io/kubernetes third_party/forked/golang/expansion): $(VAR)
    from the env, $$ a literal $, an unknown $(VAR) left as written."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                  lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), text)


def stop_agents(agents: list[subprocess.Popen], timeout: float) -> None:
    """torchrun agents still running (hung): SIGTERM makes torchrun stop its workers; SIGKILL its process group
    (started with start_new_session) if it does not within `timeout` s."""
    for agent in agents:
        if agent.poll() is None:
            agent.terminate()
            try:
                agent.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()


@contextlib.contextmanager
def submitits_stop_signal(task, after_s: float = 0.7):
    """Rank 0 of a submitit task when Slurm's stop signal comes, `after_s` into the block: submitit's own handler
    calls task.checkpoint() (stood in for by a handler that does what submitit/core/job_environment.py does), and
    Slurm signals the task's workload too. Yields the list checkpoint()'s answers are appended to."""
    from toolkit.slurm import rank_task

    answers: list = []

    def submitits_handler(_signum, _frame):
        answers.append(task.checkpoint())

    def slurm_signals_the_step():
        os.kill(rank_task._running["proc"].pid, signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGUSR2)

    previous = signal.signal(signal.SIGUSR2, submitits_handler)
    timer = threading.Timer(after_s, slurm_signals_the_step)
    timer.start()
    try:
        yield answers
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR2, previous)


def run_pods_torchrun(container: dict, args: list[str], timeout: float, **env: str) -> subprocess.CompletedProcess:
    """A rendered pod's torchrun (its command, `args` and env) run here as one node of 2 workers with a standalone
    rendezvous, the PET_* values the Kubeflow operator would set; `env` adds to the pod's. Asserts it exits 0."""
    full_env = dict(os.environ, **{e["name"]: e["value"] for e in container["env"]}, PET_NNODES="1:1",
                    PET_NPROC_PER_NODE="2", PET_MAX_RESTARTS="0", PET_STANDALONE="1", **env)
    torchrun = os.path.join(os.path.dirname(sys.executable), container["command"][0])
    res = subprocess.run([torchrun, *args], env=full_env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr[-2000:]
    return res


def slurm_wall(env: dict[str, str], job_id: str) -> tuple[float, float]:
    """Slurm's own submission and end of a job, as epoch seconds (sacct -D: a requeued job's first submission too;
    sacct prints the controller's local time, this machine's)."""
    import datetime as dt

    out = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-j", job_id, "-o", "Submit,End"], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    rows = [line.split("|") for line in out.split() if "|" in line]
    submits = [dt.datetime.fromisoformat(s).timestamp() for s, _ in rows]
    ends = [dt.datetime.fromisoformat(e).timestamp() for _, e in rows if e not in ("Unknown", "None")]
    return min(submits), max(ends)


def goodput_ledger(run_dir: str, env: dict[str, str], job_id: str) -> dict:
    """`hpc report goodput RUN_DIR --json`'s ledger of one run, checked against Slurm's own wall time: its parts add
    up to its wall time, which is Slurm's (submission to end, sacct) within 2%."""
    from tests.conftest import cli_envelope, run_hpc

    res = run_hpc("report", "goodput", run_dir, "--json", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    [ledger] = cli_envelope(res)["data"]["runs"]
    assert abs(sum(s["seconds"] for s in ledger["segments"]) - ledger["wall_s"]) < 0.01
    submitted, ended = slurm_wall(env, job_id)
    # Slurm's times are whole seconds (truncated): its wall time is known to 1 s either way. Its end also comes
    # after the job's last write that a run dir holds: the batch step's teardown and the completion's trip to the
    # controller (0-2 s seen under make test's load), which no record of the run dir can see.
    low, high = ended - submitted - 1, ended - submitted + 1
    teardown_s = 3.0
    assert 0.98 * low - teardown_s <= ledger["wall_s"] <= 1.02 * high, (ledger["wall_s"], submitted, ended, ledger)
    return ledger
