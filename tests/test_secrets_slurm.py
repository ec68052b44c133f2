"""Credentials in the submitting environment go nowhere: canary AWS keys and tokens, a real submit and a sweep
on the local Slurm, and every place a job leaves traces searched for them (bytes, pickles included)."""

from __future__ import annotations

import re
import secrets
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import cli_json, REPO, SUMMARY, run_hpc, slurm_env
from tests.jobhelpers import one_rank_cluster, write_recipe

pytestmark = pytest.mark.slurm
SLEEPER = REPO / "tests" / "payloads" / "sleeper.py"
CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "GITHUB_TOKEN", "HF_TOKEN")


def files_under(*roots: Path) -> list[Path]:
    out = []
    for root in roots:
        if root.is_file():
            out.append(root)
        elif root.is_dir():
            out += [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    return out


def leaks_in(data: bytes, canaries: dict[str, bytes]) -> list[str]:
    return [name for name, value in canaries.items() if value in data]


def ancestors(pid: int) -> list[int]:
    """The rank's process and its parents (launcher, srun step, slurmstepd), up to init."""
    chain = []
    while pid > 1:
        chain.append(pid)
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return chain


def test_canary_credentials_reach_no_script_pickle_log_state_file_or_rank_environment(slurm_sandbox, tmp_path):
    canaries = {name: f"canary{name.lower().replace('_', '')}{secrets.token_hex(8)}" for name in CREDENTIALS}
    env = dict(slurm_env(slurm_sandbox), HPC_RUNS_DIR=str(tmp_path / "runs"), **canaries)
    recipe = write_recipe(tmp_path, {
        "name": "sleeper", "description": "records its pid and sleeps", "source": "tests",
        "launcher": {"kind": "binary", "program": str(SLEEPER)}, "args": {"--n": 1},
        "resources": {"nodes": 1, "time": "00:05:00", "exclusive": False},
        "env": {"SLEEPER_OUT": str(tmp_path / "pids"), "SLEEPER_SECONDS": "6", "PYTHONPATH": str(REPO)},
    }, "sleeper.yaml")
    cluster = one_rank_cluster(slurm_sandbox, tmp_path)
    submit = ["recipes", "submit", str(recipe), "--cluster", str(cluster), "--queue", "cpu", "--json"]
    job = run_hpc(*submit, env=env, cwd=tmp_path)
    sweep = run_hpc(*submit, "--sweep", "args.--n=1,2", env=env, cwd=tmp_path)
    assert job.returncode == 0 and sweep.returncode == 0, job.stderr + sweep.stderr
    rendered = tmp_path / "rendered.sbatch"
    res = run_hpc("recipes", "render", str(recipe), "--cluster", str(cluster), "-o", str(rendered), env=env)
    assert res.returncode == 0
    wanted = {cli_json(job)["job_id"], cli_json(sweep)["job_id"]}
    run_dirs = [Path(cli_json(r)["run_dir"]) for r in (job, sweep)]

    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, env=env, timeout=30).stdout
    setting = dict(re.findall(r"^(\w+)\s*=\s*(.*?)\s*$", config, re.MULTILINE))
    state_dir = Path(setting["StateSaveLocation"])
    spool = Path(setting["SlurmdSpoolDir"].replace("%n", "x")).parent  # every node's spool dir
    slurm_logs = Path(setting["SlurmctldLogFile"]).parent
    canary_bytes = {name: value.encode() for name, value in canaries.items()}
    checked, leaks = 0, []

    # While the ranks run: their environment (and their parents'), Slurm's saved job state and the spool dirs.
    deadline = time.monotonic() + 120
    while len(list((tmp_path / "pids").glob("pid-*"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.3)
    pids = [int(p.read_text()) for p in (tmp_path / "pids").glob("pid-*")]
    assert len(pids) == 3, "the three ranks (one job, a two-task sweep) did not all start"
    for pid in pids:
        for proc in ancestors(pid):
            try:
                environ = Path(f"/proc/{proc}/environ").read_bytes()
            except (FileNotFoundError, ProcessLookupError):
                continue
            checked += 1
            leaks += [f"/proc/{proc}/environ: {name}" for name in leaks_in(environ, canary_bytes)]
        checked += 1  # the rank's own command line too
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        leaks += [f"/proc/{pid}/cmdline: {n}" for n in leaks_in(cmdline, canary_bytes)]
    live = files_under(state_dir, spool)
    assert any("job." in str(p) for p in live), "no saved job state found while the jobs run"
    for path in live:
        try:
            data = path.read_bytes()
        except OSError:
            continue  # a job's file removed as we read
        checked += 1
        leaks += [f"{path}: {name}" for name in leaks_in(data, canary_bytes)]

    # After they end: run dirs (metadata, recipes, scripts, submitit pickles and logs), the rendered script, logs.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done = [run_hpc("jobs", "status", j, "--json", env=env) for j in wanted]
        if all(cli_json(d)["state"] == "COMPLETED" for d in done if d.stdout):
            break
        time.sleep(1)
    for output in [job, sweep, *done]:  # what the CLI printed
        checked += 1
        leaks += [f"hpc output: {n}" for n in leaks_in((output.stdout + output.stderr).encode(), canary_bytes)]
    pickles = [p for p in files_under(*run_dirs) if p.suffix == ".pkl"]
    # the sweep's 2 tasks' submitted and result pickles (submitit's job array); the single job is its rendered
    # script, whose run dir, script and log are searched with the rest
    assert len(pickles) >= 4, pickles
    for path in files_under(*run_dirs, rendered, slurm_logs, state_dir, spool):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        checked += 1
        leaks += [f"{path}: {name}" for name in leaks_in(data, canary_bytes)]
    SUMMARY.append(f"secrets: {len(canaries)} canaries, {checked} places checked (rank /proc environs, saved job "
                   f"state, spool, run dirs incl. {len(pickles)} pickles, rendered script, Slurm logs), "
                   f"{len(leaks)} leaks")
    assert leaks == []
