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


@pytest.fixture(scope="session")
def slurm_sandbox():
    """The project's local Slurm, brought up the way `make slurm-up` does (a fast no-op when already up).

    Returns the discovered toolkit.sandbox.Sandbox; tests pass `slurm_env(sandbox)` to Slurm commands.
    """
    from toolkit.sandbox import discover

    res = run_hpc("sandbox", "up", "--json", timeout=900)
    assert res.returncode == 0, f"hpc sandbox up failed:\n{res.stderr}"
    sandbox = discover()
    assert sandbox is not None, "sandbox up succeeded but discover() does not see it"
    return sandbox


def slurm_env(sandbox) -> dict[str, str]:
    """This process's environment pointed at the sandbox (SLURM_CONF), for subprocesses."""
    return dict(os.environ, SLURM_CONF=str(sandbox.slurm_conf))


@pytest.fixture(autouse=True)
def _isolated_from_local_cluster(request, monkeypatch, tmp_path):
    """Tests not marked `slurm` must not see the local test cluster (hpc discovers it when it runs) or the
    user's runs: they get a sandbox dir that does not exist and a runs root of their own."""
    if request.node.get_closest_marker("slurm") is None:
        monkeypatch.setenv("HPC_SANDBOX_DIR", str(tmp_path / "no-sandbox"))
    monkeypatch.setenv("HPC_RUNS_DIR", str(tmp_path / "runs"))
