"""The same checks on every local Slurm version: this machine's 22.05, trixie's 24.11 (ParallelCluster 3.14's
major version) and forky's 26.05 (newer than ParallelCluster 3.16's 25.11: the three bracket it), the last two
from Debian root file systems beside it (`python -m testbench up --slurm 24.11|26.05`).

Each test takes the `lane` fixture, parametrized over the versions (session-scoped: pytest runs each lane's
tests together, and brings each lane up once); Slurm commands go through `lane.env()` (SLURM_CONF,
HPC_CLUSTER_CONFIG, and for a chroot lane its client wrappers first on PATH). The 22.05 lane has accounting
(sacct), the newer lanes have none, as ParallelCluster ships by default: status is checked both ways.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import cli_json, REPO, run_hpc, run_testbench, wait_until
from tests.jobhelpers import probe_recipe, read_ranks
from toolkit.rundir import RunDir

pytestmark = pytest.mark.slurm
LANES = ("22.05", "24.11", "26.05")
JOBS = sorted((REPO / "jobs").glob("*xp3dn.sbatch"))  # the sandboxes have a p3dn-shaped partition, no dl1
PAYLOADS = REPO / "tests" / "payloads"
# What 24.11's srun (not 22.05's) sets in each task so that MPI launchers started inside a step use Slurm's.
MPI_HINTS = ("OMPI_MCA_plm_slurm_args", "PRTE_MCA_plm_slurm_args", "HYDRA_BOOTSTRAP", "I_MPI_HYDRA_BOOTSTRAP")


@pytest.fixture(scope="session", params=LANES)
def lane(request):
    """The local Slurm of one version, up (a fast no-op when it already runs)."""
    from testbench import discover
    from testbench.layout import Layout

    res = run_testbench("up", "--slurm", request.param, "--json", timeout=900)
    assert res.returncode == 0, f"python -m testbench up --slurm {request.param} failed:\n{res.stderr}"
    sandbox = discover(Layout.current(request.param))
    assert sandbox is not None and sandbox.slurm == request.param
    return sandbox


def slurm(lane, *args: str, check: bool = True, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), env=kwargs.pop("env", None) or lane.env(), capture_output=True, text=True,
                          check=check, timeout=timeout, **kwargs)


@contextlib.contextmanager
def using(lane):
    """This process's Slurm commands (toolkit.slurm.*) pointed at the lane."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in lane.env().items():
            mp.setenv(key, value)
        yield


# Generous limits: the 22.05 sandbox is shared, so our jobs may queue behind others' (idle, they start in <1 s).
def lane_layout(lane):
    """What the lane is made of (node addresses, accounting)."""
    from testbench.layout import lane as lane_named

    return lane_named(lane.slurm)


def version_of(lane) -> tuple[int, int]:
    major, minor = lane.slurm.split(".")
    return int(major), int(minor)


def job_record(lane, job_id: str) -> dict[str, str]:
    out = slurm(lane, "scontrol", "-o", "show", "job", job_id).stdout
    return dict(tok.split("=", 1) for tok in out.split() if "=" in tok)


def wait_for_end(lane, job_id: str, timeout: float = 600) -> str:
    """The job's final state, polled. Not `sbatch --wait`: it polls after 2 s, then 8 s more (src/sbatch/sbatch.c
    _job_wait), so a 3-second job took 10 s."""
    from toolkit.slurm.status import State

    return wait_until(lambda: (state := State.parse(job_record(lane, job_id).get("JobState", ""))).done and state,
                      timeout, f"job {job_id} to end")


def test_the_lane_runs_the_slurm_version_it_claims(lane):
    from toolkit.slurm import version

    with using(lane):
        detected = version.detect()
    assert f"{detected.major}.{detected.minor:02d}" == lane.slurm
    assert slurm(lane, "sinfo", "--version").stdout.split()[-1].startswith(lane.slurm)


def test_rendered_script_starts_ranks_with_the_right_layout_and_only_the_allow_listed_environment(lane, tmp_path):
    recipe = probe_recipe(tmp_path)
    env = lane.env() | {"AWS_SECRET_ACCESS_KEY": "canary-secret", "HPC_TEST_MARKER": "x", "TZ": "UTC0",
                        "HPC_RUNS_DIR": str(tmp_path / "runs")}
    script = tmp_path / "job.sbatch"
    res = run_hpc("recipes", "render", str(recipe), "--nodes", "2", "--cluster", str(lane.cluster_config),
                  "--queue", "cpu", "--run-dir", str(tmp_path / "runs" / "probe"), "-o", str(script), env=env,
                  cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    # Planned on a ParallelCluster config: never expedited, even where this lane's slurm.conf has
    # enable_expedited_requeue (26.05): ParallelCluster cannot set SlurmctldParameters.
    assert "#SBATCH --requeue\n" in script.read_text() and "--requeue=expedite" not in script.read_text()
    (tmp_path / "runs" / "probe").mkdir(parents=True)
    sent = slurm(lane, "sbatch", "--parsable", str(script), env=env, cwd=tmp_path)
    job_id = sent.stdout.strip().split(";")[0]
    assert wait_for_end(lane, job_id) == "COMPLETED"
    ranks = read_ranks(tmp_path / "probe")
    assert sorted(ranks) == [0, 1, 2, 3]
    layout = sorted((r["env"]["SLURMD_NODENAME"], int(r["env"]["SLURM_PROCID"]), int(r["env"]["SLURM_LOCALID"]),
                     int(r["env"]["SLURM_NODEID"])) for r in ranks.values())
    assert layout == [("c1", 0, 0, 0), ("c1", 1, 1, 0), ("c2", 2, 0, 1), ("c2", 3, 1, 1)]
    for rank in ranks.values():
        got = rank["env"]
        assert got["SLURM_JOB_ID"] == job_id and got["MASTER_ADDR"] == "c1"
        # --export=LIST: allow-listed submitter variables arrive as they were, the rest never (Slurm adds the
        # node's login environment instead: --export=LIST implies --get-user-env).
        assert got["TZ"] == "UTC0" and "AWS_SECRET_ACCESS_KEY" not in got and "HPC_TEST_MARKER" not in got
        # 24.11's srun also exports MPI launcher hints into every task (22.05's: none).
        assert (set(MPI_HINTS) <= set(got)) == (version_of(lane) >= (24, 11)), sorted(set(MPI_HINTS) & set(got))
    assert "canary" not in json.dumps([r["env"] for r in ranks.values()])


def test_submitit_submission_runs_every_rank(lane, tmp_path):
    """With the pre-flight (this lane's own cluster config: its nodes have what it promises), whose step runs
    beside the ranks' (srun --overlap, which shares memory from 22.05 on) while they wait at its gate."""
    recipe = probe_recipe(tmp_path)
    env = lane.env() | {"HPC_RUNS_DIR": str(tmp_path / "runs")}
    res = run_hpc("recipes", "submit", str(recipe), "--nodes", "2", "--cluster", str(lane.cluster_config),
                  "--queue", "cpu", "--preflight", "--wait", "--json", env=env, cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr
    job = cli_json(res)
    assert job["state"] == "COMPLETED"
    ranks = read_ranks(tmp_path / "probe")
    assert sorted(ranks) == [0, 1, 2, 3]
    assert sorted(r["env"]["SLURMD_NODENAME"] for r in ranks.values()) == ["c1", "c1", "c2", "c2"]
    [record] = RunDir(job["run_dir"]).preflights()
    assert record["action"] == "passed" and record["nodes"] == ["c1", "c2"]
    gates = list((RunDir(job["run_dir"]).path / ".hpc" / "gates").iterdir())
    assert [g.read_text() for g in gates] == ["go\n"] and all(r["env"]["HPC_PREFLIGHT_GATE"] == str(gates[0])
                                                              for r in ranks.values())


@pytest.mark.canary  # Slurm's own srun layout and node addresses (our rank layout: the rendered-script test above)
def test_socket_rendezvous_across_two_nodes(lane, tmp_path):
    out = tmp_path / "rendezvous.out"
    slurm(lane, "sbatch", "--wait", "--nodes=2", "--ntasks-per-node=2", f"--output={out}",
          "--wrap", f"srun python3 {PAYLOADS / 'rendezvous.py'}", timeout=600)
    result = json.loads(out.read_text().strip().splitlines()[-1])
    assert result["master"] == "c1" and result["self"] == {"rank": 0, "host": "c1", "localid": 0, "nodeid": 0}
    assert result["peers"] == [{"rank": 1, "host": "c1", "localid": 1, "nodeid": 0},
                               {"rank": 2, "host": "c2", "localid": 0, "nodeid": 1},
                               {"rank": 3, "host": "c2", "localid": 1, "nodeid": 1}]
    # Each lane's nodes have their own addresses (both lanes run at once on this machine).
    assert result["master_addr"] == lane_layout(lane).cpu_nodes[0].addr


@pytest.mark.parametrize("script", JOBS, ids=[p.stem for p in JOBS])
def test_every_reviewed_render_passes_test_only_on_the_gpu_shaped_partition(lane, script: Path):
    nodes = int(re.search(r"^#SBATCH --nodes=(\d+)$", script.read_text(), re.M).group(1))
    res = slurm(lane, "sbatch", "--test-only", str(script), check=False)
    assert res.returncode == 0, res.stderr
    assert re.search(rf"to start at .* on nodes p3dn-st-p3dn-24xl-\[1-{nodes}\] in partition p3dn", res.stderr)


def test_job_array_tasks_all_run_and_status_reports_each(lane, tmp_path):
    from toolkit.slurm import status

    out = tmp_path / "array"
    out.mkdir()
    array_id = slurm(lane, "sbatch", "--parsable", "--wait", "--array=0-3", f"--output={out}/%A_%a.out",
                     "--wrap", "echo task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT", timeout=600).stdout.strip()
    assert sorted(p.read_text().strip() for p in out.iterdir()) == [f"task {i} of 4" for i in range(4)]
    with using(lane):
        found = wait_until(lambda: (s := status.query([array_id])) and len(s) == 4 and s, 30, "4 array tasks")
    assert sorted(found) == [f"{array_id}_{i}" for i in range(4)]
    assert {s.state for s in found.values()} == {"COMPLETED"}
    # With accounting (the 22.05 lane) sacct answers; without it (24.11, 26.05: ParallelCluster's default) squeue
    # does.
    assert {s.source for s in found.values()} == ({"sacct"} if lane_layout(lane).accounting else {"squeue"})


def _render_requeueable(lane, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """Our rendered script (--requeue, the batch shell's USR2 trap) around ranks that wait on the first run and
    finish at once after a requeue."""
    program = tmp_path / "wait-once.sh"
    program.write_text('#!/bin/sh\necho "rank $SLURM_PROCID restart ${SLURM_RESTART_COUNT:-0}"\n'
                       '[ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] || exec sleep 120\n')
    program.chmod(0o755)
    recipe = tmp_path / "wait-once.yaml"
    recipe.write_text(json.dumps({"name": "wait-once", "description": "waits until requeued", "source": "tests",
                                  "launcher": {"kind": "binary", "program": str(program)},
                                  "resources": {"nodes": 1, "time": "00:05:00"}}))
    env = lane.env() | {"HPC_RUNS_DIR": str(tmp_path / "runs")}
    script = tmp_path / "wait-once.sbatch"
    res = run_hpc("recipes", "render", str(recipe), "--cluster", str(lane.cluster_config), "--queue", "cpu",
                  "-o", str(script), env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "#SBATCH --requeue" in script.read_text() and "trap on_stop USR2" in script.read_text()
    return script, env


# USR2 is what our script's trap turns into a requeue; `scontrol requeue` is Slurm's own (a canary). On 22.05,
# tests/test_requeue_slurm.py::test_rendered_script_stops_saves_and_requeues_on_the_batch_shells_signal sends the
# rendered script the same signal and sees it requeue and finish: once per lane is enough for the suite's budget.
REQUEUE_CASES = [*(pytest.param(v, "sigusr2", id=f"{v}-sigusr2") for v in LANES if v != "22.05"),
                 *(pytest.param(v, "scontrol", marks=pytest.mark.canary, id=f"{v}-scontrol") for v in LANES)]


@pytest.mark.parametrize("lane,how", REQUEUE_CASES, indirect=["lane"])
def test_rendered_job_requeues_once_and_finishes(lane, tmp_path, how):
    from toolkit.slurm import status


    script, env = _render_requeueable(lane, tmp_path)
    out = re.search(r"^#SBATCH --output=(.*)$", script.read_text(), re.M).group(1)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    job_id = slurm(lane, "sbatch", "--parsable", str(script), env=env, cwd=tmp_path).stdout.strip()
    log = Path(out.replace("%j", job_id))
    wait_until(lambda: log.exists() and log.read_text().count("restart 0") == 2, 300, "both ranks' first start")
    if how == "sigusr2":  # what --signal=B:USR2@120 delivers before the time limit
        slurm(lane, "scancel", "--signal=USR2", "--batch", job_id)
    else:
        slurm(lane, "scontrol", "requeue", job_id)
    # The requeued job waits out its BeginTime (~6 s with cred_expire=5). Forcing StartTime=now is no
    # shortcut: started before its old credential expires, the job is killed ("Job credential revoked").
    wait_until(lambda: job_record(lane, job_id).get("JobState") == "COMPLETED", 300, "the requeued job to finish")
    text = log.read_text()
    assert text.count("restart 0") == 2 and text.count("restart 1") == 2, text
    # USR2 alone never requeues: with it, only the script's trap can have (its own "stop requested" line races
    # the requeue's SIGTERM to the batch shell, and loses on 24.11).
    assert "DUE TO JOB REQUEUE" in text, text
    with using(lane):
        # sacct lags the controller by up to a second: poll until it has the job's end too.
        found = wait_until(lambda: (s := status.query([job_id]).get(job_id)) and s.done and s, 30, "the job's end")
    assert found.state == "COMPLETED" and found.requeues == 1


def test_cancel_ends_a_running_job_as_cancelled(lane, tmp_path):
    from toolkit.slurm import status

    job_id = slurm(lane, "sbatch", "--parsable", f"--output={tmp_path}/sleep.out", "--wrap", "sleep 120").stdout.strip()
    wait_until(lambda: job_record(lane, job_id).get("JobState") == "RUNNING", 300, "the job to run")
    slurm(lane, "scancel", job_id)
    with using(lane):
        found = wait_until(lambda: (s := status.query([job_id]).get(job_id)) and s.done and s, 60, "cancelled")
    assert found.state == "CANCELLED"


def test_a_job_slurm_holds_ends_the_wait_with_slurms_reason(lane, tmp_path):
    """--export=LIST (our rendered scripts) implies --get-user-env; where the submitter's login fails (nobody's
    shell is nologin), Slurm >= 25.05 requeues and holds the job instead of running it (SchedMD/slurm
    CHANGELOG/slurm-25.05.md), and the wait would never end."""
    from toolkit.errors import HpcError
    from toolkit.slurm import status
    from toolkit.submit import submission

    job_id = slurm(lane, "sbatch", "--parsable", "--uid=65534", "--export=PATH", "--output=/dev/null",
                   "--wrap", "true").stdout.strip()
    try:
        with using(lane), pytest.MonkeyPatch.context() as mp:
            mp.setenv("HPC_RUNS_DIR", str(tmp_path / "runs"))
            # No run dir to fall back on: wait until Slurm's answer has the job (sacct lags the controller).
            wait_until(lambda: status.query([job_id]).get(job_id), 30, "Slurm to know the job")
            wait = lambda: submission.wait(job_id, tmp_path, lambda _m: None, poll_s=0.3, timeout_s=60)  # noqa: E731
            if version_of(lane) >= (25, 5):
                with pytest.raises(HpcError, match=r"held by Slurm \(user env retrieval failed requeued held\)"):
                    wait()
            else:
                assert wait()["state"] == "COMPLETED"
    finally:
        slurm(lane, "scancel", job_id, check=False)


def has_pmix_plugin(lane) -> bool:
    """Whether the lane's Slurm build has an mpi/pmix plugin, read from its plugin dir (not from srun, which
    doctor asks). Debian forky's 26.05.5-1 dropped it ("Remove pmix", Debian bug #1149781)."""
    plugins = slurm(lane, "scontrol", "show", "config").stdout
    plugin_dir = re.search(r"^PluginDir\s*=\s*(\S+)", plugins, re.M).group(1)
    root = lane_layout(lane).rootfs or Path("/")
    return any((root / plugin_dir.lstrip("/")).glob("mpi_pmix*.so"))


def test_doctor_reports_the_slurm_version_both_nodes_and_a_missing_pmix(lane):
    res = run_hpc("cluster", "doctor", "--cluster", str(lane.cluster_config), "--queue", "cpu", "--json",
                  env=lane.env(), timeout=600)
    data = cli_json(res)
    assert [n["facts"]["hostname"] for n in data["nodes"]] == ["c1", "c2"]
    assert data["slurm"]["version"].startswith(lane.slurm)
    if has_pmix_plugin(lane):
        assert res.returncode == 0 and data["ok"] and data["slurm"]["missing"] == [], res.stderr
    else:  # MPI binaries (nccl-tests) would not start here: doctor says so and fails
        assert res.returncode == 1 and not data["ok"]
        assert [m.split(" (")[0] for m in data["slurm"]["missing"]] == ["no pmix MPI plugin"]


@pytest.mark.parametrize("lane", ["24.11", "26.05"], indirect=True)  # nodes in a root file system of their own
def test_hpcs_own_submissions_get_no_login_environment(lane, tmp_path):
    """A rendered script's `#SBATCH --export=LIST` (for a script sent by hand) implies --get-user-env: Slurm runs the
    user's login shell on the node and adds what it exports (sbatch(1)), and on >= 25.05 holds the job where that
    fails (the test above). hpc sends its scripts with `--export=ALL` of its clean environment instead, which wins
    over the script's line: the job gets the allow-listed variables and nothing of a login shell. A marker exported
    by the nodes' /etc/profile.d shows which is which."""
    marker = lane_layout(lane).rootfs / "etc" / "profile.d" / "zz-hpc-login-marker.sh"
    marker.write_text("export HPC_LOGIN_MARKER=from-the-login-shell\n")
    try:
        # Slurm's own behaviour, so the test can tell: a variable list brings the login shell's exports
        out = tmp_path / "raw.env"
        slurm(lane, "sbatch", "--wait", "--export=PATH", f"--output={out}", "--wrap", "env", timeout=120)
        assert "HPC_LOGIN_MARKER=from-the-login-shell" in out.read_text()
        recipe = probe_recipe(tmp_path)
        env = lane.env() | {"HPC_RUNS_DIR": str(tmp_path / "runs"), "TZ": "UTC0"}
        res = run_hpc("recipes", "submit", str(recipe), "--nodes", "2", "--cluster", str(lane.cluster_config),
                      "--queue", "cpu", "--executor", "sbatch", "--wait", "--json", env=env, cwd=tmp_path,
                      timeout=300)
        assert res.returncode == 0, res.stderr
        ranks = read_ranks(tmp_path / "probe")
        assert sorted(ranks) == [0, 1, 2, 3]
        for rank in ranks.values():
            assert "HPC_LOGIN_MARKER" not in rank["env"] and rank["env"]["TZ"] == "UTC0"
    finally:
        marker.unlink(missing_ok=True)
