"""Commands the CLI prints for people to type next work as printed (`make demo` runs the venv's hpc without
putting it on PATH: its hints must name that script, not a bare `hpc`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

PRINT_PROGRAM = "from toolkit.cli.output import hpc_program; print(hpc_program())"


def printed_program(path_dirs: list[str]) -> str:
    env = {**os.environ, "PATH": os.pathsep.join(path_dirs), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", PRINT_PROGRAM], capture_output=True, text=True, env=env, cwd=REPO,
                          check=True).stdout.strip()


def test_the_printed_hpc_runs_as_printed_with_and_without_the_venv_on_path():
    venv_bin = str(Path(sys.executable).parent)
    bare = printed_program(["/usr/bin", "/bin"])  # a new user's shell after `make demo`
    assert bare != "hpc" and bare.endswith("/hpc")
    typed = subprocess.run(["bash", "-c", f"{bare} jobs --help"], capture_output=True, text=True, cwd=REPO,
                           env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")})
    assert typed.returncode == 0 and "list" in typed.stdout, typed.stderr
    assert printed_program([venv_bin, "/usr/bin", "/bin"]) == "hpc"  # an activated venv: plain hpc works
