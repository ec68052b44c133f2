#!/usr/bin/env python3
"""Cold start-up of the CLI, side by side with `pcluster version` (a benchmark that prints, not a test).

Each command runs N times as a fresh process; the medians and their ratios to `pcluster version` print.
Goals: `hpc --help` at least 5x faster than `pcluster version`; `hpc cluster validate` (schema and offline
validators included) faster than `pcluster version` alone.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "cluster-configs" / "p3dn-efa-fsx.yaml"


def median_seconds(argv: list[str], runs: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="0")
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    bin_dir = Path(sys.executable).parent
    pcluster = shutil.which("pcluster", path=str(bin_dir)) or shutil.which("pcluster")
    if not pcluster:
        raise SystemExit("pcluster not found: pip install 'hpc-toolkit[admin]'")
    hpc = [sys.executable, "-m", "toolkit"]
    commands = {
        "pcluster version": [pcluster, "version"],
        "hpc --help": [*hpc, "--help"],
        "hpc cluster validate (p3dn example)": [*hpc, "cluster", "validate", str(EXAMPLE)],
        # config checks what it writes with validate's rules: it costs about one validate
        "hpc cluster config (p4d, validated)": [*hpc, "cluster", "config", "--name", "bench", "--region", "us-east-1",
                                                "--subnet", "subnet-0123456789abcdef0", "--key-name", "k", "--queue",
                                                "p4d=p4d.24xlarge:4", "--force", "-o",
                                                str(Path(tempfile.gettempdir()) / "hpc-bench-cluster.yaml")],
    }
    for argv in commands.values():  # warm the page cache and .pyc files: "cold" means a new process
        median_seconds(argv, 1)
    medians = {name: median_seconds(argv, runs) for name, argv in commands.items()}
    base = medians["pcluster version"]
    print(f"median of {runs} runs, each a new process ({os.cpu_count()} CPUs)")
    print(f"{'command':<40}{'median s':>10}{'vs pcluster version':>22}")
    for name, seconds in medians.items():
        print(f"{name:<40}{seconds:>10.3f}{base / seconds:>21.1f}x")
    help_ok = base / medians["hpc --help"] >= 5
    validate_ok = medians["hpc cluster validate (p3dn example)"] < base
    print(f"goal hpc --help >= 5x faster: {'met' if help_ok else 'NOT met'}; "
          f"goal validate faster than pcluster version: {'met' if validate_ok else 'NOT met'}")


if __name__ == "__main__":
    main()
