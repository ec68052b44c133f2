"""Researchers' own code without Slurm: `hpc run` and `hpc recipes new` plans, the rank contract of
toolkit.job.user_main run as the ranks run it (`python -c`), and torchrun's restarts on this machine (two agents
stand in for two nodes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import cli_json, REPO, free_port, run_hpc
from tests.jobhelpers import CPU, stop_agents, write_cluster
from toolkit.errors import HpcError
from toolkit.job import staging
from toolkit.node import gate
from toolkit.slurm.materialize import build_job_spec
from toolkit.recipes.load import load_recipe
from toolkit.recipes.user import user_recipe

DDP = REPO / "recipes" / "examples" / "ddp_train.py"
PAYLOADS = REPO / "tests" / "payloads"
VENV_BIN = str(Path(sys.executable).parent)
SYSTEM_PYTHON = "/usr/bin/python3"  # this machine's own, outside the venv: it has nothing of ours (nor torch)


def dry_run(*args: str, tmp_path: Path) -> dict:
    res = run_hpc("run", *args[:1], "--cluster", str(write_cluster(tmp_path)), "--queue", "cpu", "--executor",
                  "slurm", "--dry-run", "--json", *args[1:], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    return cli_json(res)


def test_hpc_run_script_is_one_process_per_rank_with_the_script_and_its_args(tmp_path):
    plan = dry_run(str(DDP), "--nodes", "2", "--", "--steps", "7", tmp_path=tmp_path)
    assert plan["executor"] == "slurm" and plan["ranks"] == 4 and not os.path.exists(plan["run_dir"])
    params = plan["parameters"]
    assert params["ntasks_per_node"] == 2 and params["additional_parameters"]["cpus_per_task"] == 1
    argv = plan["rank0_argv"]
    assert argv[:2] == ["python", "-c"] and argv[3:] == ["300", str(DDP), "--steps", "7"]
    # Every task runs the rank program: the contract exported from srun's task, then user_main.
    program = plan["rank_program"]
    assert program[:2] == ["bash", "-c"] and program[3:] == argv
    assert 'RANK="${SLURM_PROCID}"' in program[2] and "WORLD_SIZE=4 LOCAL_WORLD_SIZE=2" in program[2]
    assert "--ntasks-per-node=2" in plan["parameters"]["srun_args"]


def test_hpc_run_torchrun_is_one_torchrun_per_node(tmp_path):
    plan = dry_run(str(DDP), "--nodes", "2", "--launcher", "torchrun", "--max-restarts", "3", "--", "--steps", "7",
                   tmp_path=tmp_path)
    params = plan["parameters"]
    assert params["ntasks_per_node"] == 1 and params["additional_parameters"]["ntasks_per_node"] == 1
    assert params["additional_parameters"]["cpus_per_task"] == 2  # the node's two ranks' CPUs
    assert "--ntasks-per-node=1" in params["srun_args"] and "--cpus-per-task=2" in params["srun_args"]
    argv = plan["rank0_argv"]
    torchrun = argv[:argv.index("--no-python")]
    assert torchrun[:2] == ["python", "-c"] and "from torch.distributed.run import main" in torchrun[2]
    for flag, value in (("--nnodes", "2"), ("--nproc-per-node", "2"), ("--rdzv-backend", "c10d"),
                        ("--max-restarts", "3"), ("--rdzv-conf", "join_timeout=300")):
        assert torchrun[torchrun.index(flag) + 1] == value
    assert argv[-3:] == [str(DDP), "--steps", "7"]
    # torchrun sets the rank contract for its workers: after the pre-flight's gate, the program exports only the
    # heartbeat dir (the run dir's) and puts the staged node-side code first on PYTHONPATH (`from hpc_node.heartbeat
    # import beat`)
    bundle = f"{plan['run_dir']}/.hpc/{staging.bundle_name()}"
    assert plan["rank_program"][2] == (f"{gate.wait_script()}; export HPC_HEARTBEAT_DIR={plan['run_dir']}/heartbeats; "
                                       f"export PYTHONPATH={bundle}\"${{PYTHONPATH:+:$PYTHONPATH}}\"; "
                                       "exec \"$0\" \"$@\"")
    # The rendezvous: the first node, the job's port, the job id as id (torchrun's own variables).
    assert 'export PET_RDZV_ENDPOINT="$MASTER_ADDR:$MASTER_PORT" PET_RDZV_ID="$SLURM_JOB_ID"' in plan["script"]
    assert any("PET_RDZV_ENDPOINT" in line for line in params["setup"])


def test_hpc_run_a_module(tmp_path):
    plan = dry_run("json.tool", "--", "--sort-keys", tmp_path=tmp_path)
    assert plan["rank0_argv"][-3:] == ["-m", "json.tool", "--sort-keys"]  # no trainer flags added to user code


@pytest.mark.parametrize("args,code,expected", [
    (["missing.py"], 1, "script {tmp}/missing.py does not exist"),
    (["x.py", "--max-restarts", "2"], 2, "--max-restarts needs --launcher torchrun"),
    (["x.py", "--launcher", "mpirun"], 2, "--launcher 'mpirun' is not one of script, torchrun"),
    (["not a module!"], 2, "is neither a Python script"),
    (["x.py", "--env", "=1"], 2, "--env '=1' is not NAME=VALUE"),
])
def test_bad_hpc_run_input_gets_one_clear_error(tmp_path, args, code, expected):
    (tmp_path / "x.py").write_text("print('hi')\n")
    res = run_hpc("run", *args, "--cluster", str(write_cluster(tmp_path)), "--queue", "cpu", "--executor", "slurm",
                  "--dry-run", cwd=tmp_path)
    assert res.returncode == code, res.stderr
    assert expected.format(tmp=tmp_path) in res.stderr and "Traceback" not in res.stderr
    assert res.stderr.count("error:") == 1


def test_a_missing_script_is_refused_before_anything_is_submitted(tmp_path):
    res = run_hpc("run", str(tmp_path / "nope.py"), "--cluster", str(write_cluster(tmp_path)), "--queue", "cpu",
                  "--executor", "slurm", "--json", cwd=tmp_path)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert f"error: script {tmp_path}/nope.py does not exist" in res.stderr and res.stderr.count("error:") == 1
    assert not (tmp_path / "runs").exists() and not Path(os.environ["HPC_RUNS_DIR"]).exists()


def test_recipes_new_writes_the_recipe_hpc_run_submits(tmp_path):
    cluster = str(write_cluster(tmp_path))
    res = run_hpc("recipes", "new", "ddp_train", "--script", str(DDP), "--nodes", "2", "--launcher", "torchrun",
                  "--max-restarts", "1", "--", "--steps", "9", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    path = tmp_path / "recipes" / "ddp_train.yaml"
    data = yaml.safe_load(path.read_text())
    assert data["launcher"] == {"kind": "python-script", "script": str(DDP), "style": "torchrun",
                                "argv": ["--steps", "9"], "max_restarts": 1}
    assert run_hpc("recipes", "validate", str(path)).returncode == 0
    again = run_hpc("recipes", "new", "ddp_train", "--script", str(DDP), cwd=tmp_path)
    assert again.returncode == 1 and "exists" in again.stderr
    common = ["--cluster", cluster, "--queue", "cpu", "--executor", "slurm", "--dry-run", "--json"]
    from_file = cli_json(run_hpc("recipes", "submit", "ddp_train", *common, cwd=tmp_path))
    from_run = cli_json(run_hpc("run", str(DDP), "--nodes", "2", "--launcher", "torchrun", "--max-restarts", "1",
                                  *common, "--", "--steps", "9", cwd=tmp_path))
    for key in ("script", "parameters", "rank0_argv"):
        assert json.dumps(from_file[key]).replace(from_file["run_dir"], "<RUN>") == \
            json.dumps(from_run[key]).replace(from_run["run_dir"], "<RUN>")


def test_the_resnet_recipe_runs_under_torchrun_with_its_trainer_flags(tmp_path):
    res = run_hpc("recipes", "submit", "resnet50", "--profile", "smoke", "--nodes", "2", "--set",
                  "launcher.style=torchrun", "--set", "launcher.max_restarts=2", "--cluster",
                  str(write_cluster(tmp_path)), "--queue", "cpu", "--executor", "slurm", "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    argv = cli_json(res)["rank0_argv"]
    assert "from torch.distributed.run import main" in argv[2] and "--max-restarts" in argv
    tail = argv[argv.index("-m", 3):]
    assert tail[1] == "toolkit.workloads.resnet" and tail[tail.index("--device") + 1] == "cpu"


def test_torchrun_style_is_for_python_code_only(tmp_path):
    with pytest.raises(HpcError, match="only for python-module and python-script"):
        load_recipe("nccl-tests", overrides=["launcher.style=torchrun"])


# -- the rank contract, run as each rank runs it -------------------------------------------------------------------

def rank_argv(target: str, *args: str, nodes: int = 2, **choices) -> list[str]:
    """What srun starts on each task for `hpc run TARGET` on the 2-rank CPU queue: the rank program (python: this
    venv's)."""
    recipe = load_recipe("own", data=user_recipe(target, list(args), nodes=nodes, **choices))
    spec = build_job_spec(recipe, CPU, nodes)
    assert all(isinstance(word, str) for word in spec.command)  # no per-rank placeholders: user_main reads the env
    bash, c, script, *words = spec.program.argv
    return [bash, c, script, *(sys.executable if w == "python" else w for w in words)]


def slurm_task(rank: int, **extra: str) -> dict[str, str]:
    return dict(os.environ, SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank % 2), SLURM_NODEID=str(rank // 2),
                MASTER_ADDR="n1", MASTER_PORT="15123", **extra)


@pytest.mark.training
def test_script_style_sets_the_torchrun_environment_from_the_slurm_task(tmp_path):
    argv = rank_argv(str(PAYLOADS / "print_env.py"), "--x", "it's")
    # The first rank of node 0 and the last of node 1 (the others differ only in the same arithmetic), at once.
    ranks = {rank: subprocess.Popen(argv, env=slurm_task(rank), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, cwd=tmp_path) for rank in (0, 3)}
    for rank, proc in ranks.items():
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        seen = json.loads(out)
        assert seen["env"] == {"RANK": str(rank), "LOCAL_RANK": str(rank % 2), "WORLD_SIZE": "4",
                               "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": str(rank // 2), "MASTER_ADDR": "n1",
                               "MASTER_PORT": "15123"}
        assert seen["argv"] == [str(PAYLOADS / "print_env.py"), "--x", "it's"] and seen["name"] == "__main__"
        assert seen["path0"] == str(PAYLOADS)  # as `python SCRIPT.py` sets sys.path[0]


def test_a_module_that_cannot_be_imported_fails_the_rank_with_one_line(tmp_path):
    res = subprocess.run(rank_argv("no_such_pkg.train"), env=slurm_task(1), capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert res.returncode == 1
    assert res.stderr.startswith("hpc: error: rank 1 on ") and "module 'no_such_pkg.train' cannot be imported" in \
        res.stderr and res.stderr.count("\n") == 1


def test_a_script_missing_on_the_node_fails_the_rank_with_one_line(tmp_path):
    script = tmp_path / "gone.py"
    script.write_text("")
    argv = rank_argv(str(script))
    script.unlink()
    res = subprocess.run(argv, env=slurm_task(0), capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and f"script {script} does not exist on this node" in res.stderr


@pytest.mark.training
def test_a_script_that_ignores_the_environment_ends_at_the_rendezvous_timeout(tmp_path):
    argv = rank_argv(str(PAYLOADS / "ignores_env.py"), str(free_port()), rendezvous_timeout_s=8)
    start = time.monotonic()
    res = subprocess.run(argv, env=slurm_task(0), capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and time.monotonic() - start < 60
    assert "init_process_group did not complete within 8 s" in res.stderr and "joined" not in res.stdout


@pytest.mark.training
def test_torchrun_and_its_ranks_outlive_the_time_limit_signal(tmp_path):
    """Slurm sends SIGUSR2 to every process of the step before the time limit: the torchrun agent and a script
    that does not handle it keep running (the job requeues itself; the rerun resumes from its checkpoint)."""
    pids = tmp_path / "pids"
    argv = rank_argv(str(PAYLOADS / "usr2_survivor.py"), str(pids), "4", nodes=1, style="torchrun")
    env = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ["PATH"],
               PET_RDZV_ENDPOINT=f"127.0.0.1:{free_port()}", PET_RDZV_ID="usr2")
    agent = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while len(list(pids.glob("*.pid"))) < 2:
        assert agent.poll() is None and time.monotonic() < deadline, agent.stdout.read() if agent.poll() else "slow"
        time.sleep(0.1)
    for pid in [agent.pid, *(int(p.read_text()) for p in pids.glob("*.pid"))]:
        os.kill(pid, signal.SIGUSR2)
    out, _ = agent.communicate(timeout=60)
    assert agent.returncode == 0, out
    assert "done 0" in out and "done 1" in out


def test_a_torchrun_restart_of_the_workers_is_one_line_in_the_log_that_status_reads(tmp_path):
    """A fault probe: torchrun restarted the workers and neither --wait nor `hpc jobs status` said so (torchrun
    logs it at INFO, below its default level). Each worker's first code (toolkit.job.user_main) under a Python with
    nothing of ours, given the variables torchrun sets its workers (local_elastic_agent.py): a stand-in for
    torchrun, whose real restart on the local Slurm is tests/test_own_code_slurm.py's."""
    from toolkit.launchers.torchrun import user_main_code
    from toolkit.rundir import Metadata, RunDir
    from toolkit.submit.submission import torchrun_restart_lines

    def worker(local_rank: int, restart: int) -> str:
        env = {"PATH": os.environ["PATH"], "LOCAL_RANK": str(local_rank), "TORCHELASTIC_RESTART_COUNT": str(restart),
               "TORCHELASTIC_MAX_RESTARTS": "2", "SLURMD_NODENAME": "c2"}
        done = subprocess.run([SYSTEM_PYTHON, "-c", user_main_code(), "30", str(PAYLOADS / "print_env.py")],
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stderr

    said = worker(0, 1)
    assert said == "hpc: torchrun restart 1 of 2 on c2: this node's workers started again after one of them failed\n"
    assert worker(1, 1) == "" and worker(0, 0) == ""  # local rank 0 speaks for its node, and only after a restart
    # as the rendered script's one log holds it (srun --label), read back for jobs status and --wait
    run = RunDir(tmp_path / "runs" / "own").create()
    run.write_metadata(Metadata(recipe="own", executor="sbatch", job_ids=["55"]))
    (run.path / "own-55.out").write_text(f"0: {said}1: {said}")
    assert run.torchrun_restarts("55") == [{"node": "c2", "restart": 1, "of": "2"}]  # each restart once
    assert run.torchrun_restarts("56") == []
    assert torchrun_restart_lines(run.torchrun_restarts("55")) == [
        "torchrun restarted the workers (restart 1 of 2) after a worker on c2 failed"]


# -- torchrun restarts (the torch 2.14.1 stale-store bug) ----------------------------------------------------------

def run_two_agents(worker: list[str], tmp_path: Path, kill_rank: int = 3,
                   finish_s: float = 240) -> tuple[list[int | None], str, int]:
    """Two torchrun agents on this machine (nodes 0 and 1 of one rendezvous); SIGKILL one worker once the first
    checkpoint exists. Returns the agents' exit codes (None: still running `finish_s` after the kill, then
    killed), their output, and the step saved before the kill."""
    port = free_port()
    ckpt, pids = tmp_path / "ckpt", tmp_path / "pids"
    env = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ["PATH"], PET_RDZV_ENDPOINT=f"127.0.0.1:{port}",
               PET_RDZV_ID="test", PYTHONUNBUFFERED="1")
    args = ["--steps", "40", "--step-seconds", "0.1", "--checkpoint-every", "5", "--log-every", "5",
            "--checkpoint-dir", str(ckpt), "--pid-dir", str(pids)]
    logs = [open(tmp_path / f"agent{i}.log", "w") for i in range(2)]
    agents = [subprocess.Popen([*worker, *args], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
              for log in logs]
    try:
        deadline = time.monotonic() + 120
        while not (ckpt / "checkpoint.pt").exists() or not (pids / f"rank-{kill_rank}.pid").exists():
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.1)
        import torch

        saved = torch.load(ckpt / "checkpoint.pt")["step"]
        os.kill(int((pids / f"rank-{kill_rank}.pid").read_text()), signal.SIGKILL)
        deadline = time.monotonic() + finish_s
        codes: list[int | None] = []
        for agent in agents:
            try:
                codes.append(agent.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
    finally:
        stop_agents(agents, timeout=30)
        for log in logs:
            log.close()
    return codes, "".join((tmp_path / f"agent{i}.log").read_text() for i in range(2)), saved


def strays(marker: str) -> list[str]:
    """Processes whose command line mentions `marker` (a test's own directory)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if proc.name.isdigit() and marker in cmdline:
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


@pytest.mark.canary
@pytest.mark.training
def test_plain_torchrun_restarts_hang_on_this_torch(tmp_path):
    """The control: the same kill under plain torchrun (workers on the agent's store) never completes after the
    restart (the workers fail connecting to the old round's peers, or hang in init_process_group): the bug
    toolkit.job.spec.TORCHRUN_ENV avoids (with it, the same kill recovers: tests/test_own_code_slurm.py under hpc
    run on the local Slurm, tests/test_elastic_restart.py for the pods). When torch fixes it, this fails: then
    TORCHRUN_ENV can go. (The run with the fix completes within ~20 s; 90 s here is plenty.)"""
    codes, out, _ = run_two_agents([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node",
                                    "2", "--rdzv-backend", "c10d", "--max-restarts", "1", str(DDP)], tmp_path,
                                   finish_s=90)
    leftover = strays(str(tmp_path))
    for line in leftover:  # workers of a killed agent: this test's own processes, ended by pid
        os.kill(int(line.split(":")[0]), signal.SIGKILL)
    assert codes != [0, 0], out[-3000:]
    assert '"event": "end"' not in out
