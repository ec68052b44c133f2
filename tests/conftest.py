"""Shared test helpers: run the real `hpc` CLI in this process (or in a subprocess where the process matters)."""

from __future__ import annotations

import collections
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The suite's own cache (toolkit.cache), not the user's ~/.cache/hpc: shared by the session's hpc processes, removed
# with it. tests/test_cache.py points single tests at caches of their own.
if "HPC_CACHE_DIR" not in os.environ:
    import atexit
    import shutil

    os.environ["HPC_CACHE_DIR"] = tempfile.mkdtemp(prefix="hpc-test-cache-")
    atexit.register(shutil.rmtree, os.environ["HPC_CACHE_DIR"], True)

# The straggler line for a clean run on this bench: a rank twice its peers' own work. The default (+30%) is for nodes
# with their own CPUs or GPUs; here 4 single-threaded ranks share the CI's 2 cores with another test's job, and a
# clean run's rank 1 once did 1.6x its peers' work in 17 of 21 windows (stop 41's CI: 252 ms vs 155 ms).
# A node cut to 0.4 CPU is flagged at the default line (tests/test_stragglers_slurm.py).
CLEAN_RUN_LINE = ("--straggler-threshold", "1.0")


def run_hpc(*args: str, env: dict[str, str] | None = None, cwd: str | Path | None = None,
            timeout: float = 120, input: str | None = None) -> subprocess.CompletedProcess:
    """`hpc ARGS` in this process (toolkit.cli.main.main), shaped like `run_hpc_process`: exit code, text output.

    `env` is the whole environment for the call's duration, as for a subprocess; the environment, cwd, argv and
    PyYAML's SafeLoader (pcluster changes it when imported) are restored after. Output is captured at the file
    descriptors too, so what a child process the command starts writes is in it, in order. Past `timeout`
    seconds the call is interrupted (SIGALRM) and subprocess.TimeoutExpired raised, as subprocess.run does.
    """
    import yaml

    from toolkit.cli.main import main

    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    saved_streams = sys.stdin, sys.stdout, sys.stderr
    saved_constructors = dict(yaml.SafeLoader.yaml_constructors)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved_fds = os.dup(1), os.dup(2)
    outputs = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        os.environ["PYTHONPATH"] = str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")
        # readline (loaded with pytest) puts LINES and COLUMNS in the C environment behind os.environ's back: a
        # process the command starts with the inherited environment (sbatch under submitit) would get them.
        for name in ("LINES", "COLUMNS"):
            if name not in os.environ:
                os.unsetenv(name)
        os.chdir(cwd or REPO)
        sys.argv = ["hpc", *args]
        for fd, out in zip((1, 2), outputs, strict=True):
            os.dup2(out.fileno(), fd)
        sys.stdin = io.StringIO(input or "")
        sys.stdout, sys.stderr = (io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8",
                                                   write_through=True) for fd in (1, 2))

        def interrupt(signum, frame):
            raise _Timeout()
        saved_alarm = signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            main(list(args))
            code = 0
        except _Timeout:
            raise subprocess.TimeoutExpired(["hpc", *args], timeout) from None
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if isinstance(exc.code, str):
                sys.stderr.write(exc.code + "\n")
        except BaseException:  # what the interpreter would print for an uncaught exception (--debug)
            traceback.print_exc()
            code = 1
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, saved_alarm)
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        for fd, saved in zip((1, 2), saved_fds, strict=True):
            os.dup2(saved, fd)
            os.close(saved)
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        yaml.SafeLoader.yaml_constructors = saved_constructors
    stdout, stderr = [_read_back(out) for out in outputs]
    return subprocess.CompletedProcess(["hpc", *args], code, stdout, stderr)


class _Timeout(BaseException):
    """Raised by SIGALRM inside an in-process call: a BaseException, so main's `except Exception` lets it by."""


def _read_back(out) -> str:
    out.seek(0)
    text = out.read().decode("utf-8", errors="replace")
    out.close()
    return text


def run_hpc_process(*args: str, env: dict[str, str] | None = None, cwd: str | Path | None = None,
                    timeout: float = 120, input: str | None = None) -> subprocess.CompletedProcess:
    """`hpc ARGS` as a subprocess with this checkout's toolkit first on the path; text output captured. For what
    needs a process of its own: import time, PATH, a sitecustomize trap."""
    full_env = dict(os.environ if env is None else env)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd or REPO, timeout=timeout, input=input)


def cli_envelope(res: subprocess.CompletedProcess) -> dict:
    """The one JSON envelope a command printed with `--json` (toolkit.cli.output: ok, command, data, warnings,
    error), checked for its shape: ok and the exit code agree, and a failure says why."""
    doc = json.loads(res.stdout)
    assert set(doc) >= {"ok", "command", "data", "warnings"}, doc
    assert doc["ok"] is (res.returncode == 0), (res.returncode, doc)
    if not doc["ok"]:
        assert doc["error"]["message"] and doc["error"]["exit_code"] == res.returncode, doc
    return doc


def cli_json(res: subprocess.CompletedProcess):
    """What a command reported with `--json` (the envelope's data): the one place tests read the JSON output."""
    return cli_envelope(res)["data"]


def submit_json(*args: str, env: dict[str, str], cwd: str | Path | None = None, timeout: float = 900) -> dict:
    """`hpc recipes submit ARGS --json` as users run it; asserts it succeeded and returns its JSON."""
    res = run_hpc("recipes", "submit", *args, "--json", env=env, cwd=cwd, timeout=timeout)
    assert res.returncode == 0, res.stdout + res.stderr
    return cli_json(res)


def wait_until(predicate, timeout: float, what: str, poll_s: float = 0.3, describe=None):
    """predicate()'s first true value, polled until `timeout` seconds; an AssertionError naming `what` after
    (and what `describe()` says of the state then: a CI failure is read from its message alone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}" + (f": {describe()}" if describe else ""))


def free_port(span: int = 1) -> int:
    """A TCP port P on 127.0.0.1 with P..P+span-1 all free right now (for a rendezvous in a test).

    Drawn below the kernel's ephemeral range (net.ipv4.ip_local_port_range), which every connect() and bind to
    port 0 draws from: a port from that range can be taken by any client socket between this check and the
    server's bind (CI saw a worker's TCPStore fail with EADDRINUSE on MASTER_PORT+1 that way).
    """
    import random

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(200):
        port = random.randrange(10000, low - span)
        try:
            for offset in range(span):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port + offset))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no {span} free ports in a row between 10000 and {low}")


# Lines the reliability tests (corpus, fuzz, secrets) report: printed in pytest's terminal summary, also in CI.
# Under xdist (`make test`) each worker sends its lines to the controller, which prints each distinct line once.
# A count that the workers' parts add up to (the corpus's cases passed: its Slurm cases run on another worker than
# the rest) goes in TALLIES[name] instead, printed once as "NAME: total (key n, ...)" over every worker.
SUMMARY: list[str] = []
TALLIES: dict[str, collections.Counter] = {}


def tally(name: str) -> collections.Counter:
    """The count named `name`, summed over the workers in the terminal summary."""
    return TALLIES.setdefault(name, collections.Counter())


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker
        workeroutput["reliability_counts"] = list(SUMMARY)
        workeroutput["reliability_tallies"] = {name: dict(counts) for name, counts in TALLIES.items()}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    output = getattr(node, "workeroutput", {})
    SUMMARY.extend(output.get("reliability_counts", []))
    for name, counts in output.get("reliability_tallies", {}).items():
        tally(name).update(counts)


def pytest_terminal_summary(terminalreporter):
    if SUMMARY or TALLIES:
        terminalreporter.section("reliability counts")
        for line in dict.fromkeys(SUMMARY):
            terminalreporter.write_line(line)
        for name, counts in TALLIES.items():
            parts = ", ".join(f"{key} {n}" for key, n in counts.items())
            terminalreporter.write_line(f"{name}: {sum(counts.values())} ({parts})")


# `make test` runs the suite on two xdist workers (--dist loadgroup): the unit tests beside the Slurm tests, which
# mostly wait on Slurm. Each Slurm lane is a cluster of its own, so each lane's tests form one xdist group: run in
# order on one worker, never two jobs of one lane's tests at once (they share its nodes, as before); lanes run
# beside each other. A test's lane: its fixture (node_lane; container_lane; a conformance lane's version;
# 22.05 is the default lane) or else the default lane (slurm_sandbox).
DEFAULT_LANE_GROUP = "lane-22.05"


def lane_group(item) -> str | None:
    """The xdist group of a `slurm` test (None for a unit test)."""
    if item.get_closest_marker("slurm") is None:
        return None
    if "node_lane" in item.fixturenames:
        return "lane-bullseye"
    if "container_lane" in item.fixturenames:
        return "lane-22.05-pyxis"
    version = getattr(item, "callspec", None) and item.callspec.params.get("lane")
    return f"lane-{version}" if isinstance(version, str) else DEFAULT_LANE_GROUP


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks into the group names
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = lane_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


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
    or one named in the user's environment) or the user's runs: they get a runs root of their own. A `slurm` test
    gets a fleet ledger of its own (HPC_FLEET_DIR, in what slurm_env() passes on): a test's cluster config with an
    FSx mount would otherwise make its jobs record in the machine's /fsx/hpc-fleet, and a node one test failed on
    purpose would be left out of another test's jobs (toolkit.health.fleet)."""
    if request.node.get_closest_marker("slurm") is None:
        for name in ("SLURM_CONF", "HPC_CLUSTER_CONFIG", "HPC_FLEET_DIR"):  # the user's fleet ledger too
            monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv("HPC_FLEET_DIR", str(tmp_path / "fleet"))
    monkeypatch.setenv("HPC_RUNS_DIR", str(tmp_path / "runs"))


@pytest.fixture(scope="session")
def node_lane():
    """The node lane (`python -m testbench up --slurm bullseye`, a fast no-op when up): this machine's Slurm 22.05
    controller and clients, with Debian bullseye nodes (slurmd 20.11, python3 3.9) that see nothing of this
    machine but one shared dir at /fsx. Returns its testbench.Sandbox: `.env()` points Slurm, hpc and
    HPC_RUNS_DIR (on /fsx) at it, `.shared_dir` is where both sides see the shared dir. os.environ is left alone:
    the same session also runs the default lane's tests."""
    from testbench import discover
    from testbench.layout import Layout

    res = run_testbench("up", "--slurm", "bullseye", "--json", timeout=900)
    assert res.returncode == 0, f"python -m testbench up --slurm bullseye failed:\n{res.stderr}"
    sandbox = discover(Layout.current("bullseye"))
    assert sandbox is not None and sandbox.shared_dir is not None, "the node lane is up but discover() misses it"
    return sandbox


@pytest.fixture
def shared_tmp(node_lane, request):
    """A fresh dir on the node lane's shared dir, at the same path on this machine and on its nodes (where
    jobs' scripts, payloads and outputs must be); removed afterwards."""
    import re
    import shutil
    import uuid

    name = re.sub(r"[^\w.-]", "_", request.node.name)[:60]
    path = node_lane.shared_dir / "tests" / f"{name}-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)
