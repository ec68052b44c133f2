"""Shared test helpers: run the real `hpc` CLI in a subprocess, the way users and scripts do."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_hpc(*args: str, env: dict[str, str] | None = None, cwd: str | Path | None = None,
            timeout: float = 120, input: str | None = None) -> subprocess.CompletedProcess:
    """`hpc ARGS` as a subprocess with this checkout's toolkit first on the path; text output captured."""
    full_env = dict(os.environ if env is None else env)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd or REPO, timeout=timeout, input=input)


def submit_json(*args: str, env: dict[str, str], cwd: str | Path | None = None, timeout: float = 900) -> dict:
    """`hpc recipes submit ARGS --json` as users run it; asserts it succeeded and returns its JSON."""
    res = run_hpc("recipes", "submit", *args, "--json", env=env, cwd=cwd, timeout=timeout)
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout)


def wait_until(predicate, timeout: float, what: str, poll_s: float = 0.3):
    """predicate()'s first true value, polled until `timeout` seconds; an AssertionError naming `what` after."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for a rendezvous in a test)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Lines the reliability tests (corpus, fuzz, secrets) report: printed in pytest's terminal summary, also in CI.
SUMMARY: list[str] = []


def pytest_terminal_summary(terminalreporter):
    if SUMMARY:
        terminalreporter.section("reliability counts")
        for line in SUMMARY:
            terminalreporter.write_line(line)


@pytest.fixture
def hpc():
    return run_hpc


def run_testbench(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m testbench ARGS` (the local test cluster's own CLI) as `make slurm-up` runs it."""
    full_env = dict(os.environ if env is None else env)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "testbench", *args], capture_output=True, text=True, env=full_env,
                          cwd=REPO, timeout=timeout)


@pytest.fixture(scope="session")
def slurm_sandbox():
    """The project's local Slurm, brought up the way `make slurm-up` does (a fast no-op when already up), and
    found the way users find a cluster: SLURM_CONF and HPC_CLUSTER_CONFIG, set in os.environ for the session
    (in-process calls and subprocesses both see them; tests not marked `slurm` do not).

    Returns the discovered testbench.Sandbox; `slurm_env(sandbox)` is an environment pointed at it.
    """
    from testbench import discover

    res = run_testbench("up", "--json", timeout=900)
    assert res.returncode == 0, f"python -m testbench up failed:\n{res.stderr}"
    sandbox = discover()
    assert sandbox is not None, "testbench up succeeded but discover() does not see it"
    os.environ.update(sandbox.env())
    return sandbox


def slurm_env(sandbox) -> dict[str, str]:
    """This process's environment pointed at the sandbox (SLURM_CONF, HPC_CLUSTER_CONFIG), for subprocesses."""
    return sandbox.env()


@pytest.fixture(autouse=True)
def _isolated_from_local_cluster(request, monkeypatch, tmp_path):
    """Tests not marked `slurm` must not see a cluster (the local one that slurm_sandbox points this session at,
    or one named in the user's environment) or the user's runs: they get a runs root of their own."""
    if request.node.get_closest_marker("slurm") is None:
        for name in ("SLURM_CONF", "HPC_CLUSTER_CONFIG"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HPC_RUNS_DIR", str(tmp_path / "runs"))
