"""Shared test helpers: run the real `hpc` CLI in a subprocess, the way users and scripts do."""

from __future__ import annotations

import os
import subprocess
import sys
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


@pytest.fixture
def hpc():
    return run_hpc
