#!/usr/bin/env python3
"""Regenerate every example in cluster-configs/ with the command recorded in its own header.

Each example starts with the `hpc cluster config ... -o cluster-configs/NAME.yaml` line that made it, so the
files describe themselves. `python cluster-configs/regenerate.py` rewrites them in place; `--into DIR`
writes them under DIR/cluster-configs/ instead (the test compares those bytes with the checked-in files).
To add an example, run its `hpc cluster config` command once from the repository root.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def recorded_command(example: Path) -> list[str]:
    """The hpc arguments from the header line `#   hpc cluster config ...`."""
    for line in example.read_text().splitlines():
        if line.startswith("#   hpc cluster config "):
            return shlex.split(line[len("#   hpc "):])
    raise SystemExit(f"{example}: no `hpc cluster config` line in its header")


def regenerate(into: Path) -> list[Path]:
    written = []
    for example in sorted(HERE.glob("*.yaml")):
        args = recorded_command(example)
        subprocess.run([sys.executable, "-m", "toolkit", *args, "--force"], cwd=into, check=True,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, stdout=subprocess.DEVNULL)
        written.append(into / "cluster-configs" / example.name)
    return written


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--into", type=Path, default=REPO, help="directory to write cluster-configs/ under")
    for path in regenerate(parser.parse_args().into):
        print(path)
