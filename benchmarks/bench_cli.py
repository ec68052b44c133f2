#!/usr/bin/env python3
"""Cold start-up of the CLI, side by side with `pcluster version` (a benchmark that prints, not a test).

Each command runs N times as a fresh process; the medians and their ratios to `pcluster version` print.
Goals: `hpc --help` at least 5x faster than `pcluster version`; `hpc cluster validate` (schema and offline
validators included) and `hpc cluster diff` (pcluster's own update policies, on two example updates made with
`hpc cluster queue`) faster than `pcluster version` alone.
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
DIFF_OLD = {"p5": REPO / "cluster-configs" / "p5-reservation.yaml",
            "aws": REPO / "tests" / "data" / "aws-style-cluster.yaml"}


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


def diff_pairs(hpc: list[str], into: Path) -> dict[str, list[str]]:
    """Two updates an admin makes with `hpc cluster queue`, as `hpc cluster diff OLD NEW` commands."""
    edits = {"p5": [["set", "p5", "--max", "8"], ["add", "--queue-spec", "extra=p4d.24xlarge:2"]],
             "aws": [["remove", "cpu"]]}
    pairs = {}
    for name, steps in edits.items():
        new = into / f"{name}-new.yaml"
        new.write_bytes(DIFF_OLD[name].read_bytes())
        for step in steps:
            subprocess.run([*hpc, "cluster", "queue", step[0], str(new), *step[1:]], check=True,
                           capture_output=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
        pairs[name] = [*hpc, "cluster", "diff", str(DIFF_OLD[name]), str(new)]
    pairs["aws"] += ["--fleet", "stopped"]  # removing a queue needs the fleet stopped (or TERMINATE)
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    bin_dir = Path(sys.executable).parent
    pcluster = shutil.which("pcluster", path=str(bin_dir)) or shutil.which("pcluster")
    if not pcluster:
        raise SystemExit("pcluster not found: pip install 'hpc-toolkit[admin]'")
    hpc = [sys.executable, "-m", "toolkit"]
    pairs = diff_pairs(hpc, Path(tempfile.mkdtemp(prefix="bench-diff-")))
    commands = {
        "pcluster version": [pcluster, "version"],
        "hpc --help": [*hpc, "--help"],
        "hpc cluster validate (p3dn example)": [*hpc, "cluster", "validate", str(EXAMPLE)],
        # config checks what it writes with validate's rules: it costs about one validate
        "hpc cluster config (p4d, validated)": [*hpc, "cluster", "config", "--name", "bench", "--region", "us-east-1",
                                                "--subnet", "subnet-0123456789abcdef0", "--key-name", "k",
                                                "--queue-spec", "p4d=p4d.24xlarge:4", "--force", "-o",
                                                str(Path(tempfile.gettempdir()) / "hpc-bench-cluster.yaml")],
        "hpc cluster diff (p5: max up, queue add)": pairs["p5"],
        "hpc cluster diff (AWS-style: queue remove)": pairs["aws"],
    }
    for argv in commands.values():  # warm the page cache and .pyc files: "cold" means a new process
        median_seconds(argv, 1)
    medians = {name: median_seconds(argv, runs) for name, argv in commands.items()}
    base = medians["pcluster version"]
    print(f"median of {runs} runs, each a new process ({os.cpu_count()} CPUs)")
    print(f"{'command':<44}{'median s':>10}{'vs pcluster version':>22}")
    for name, seconds in medians.items():
        print(f"{name:<44}{seconds:>10.3f}{base / seconds:>21.1f}x")
    help_ok = base / medians["hpc --help"] >= 5
    validate_ok = medians["hpc cluster validate (p3dn example)"] < base
    diff_ok = all(seconds < base for name, seconds in medians.items() if name.startswith("hpc cluster diff"))
    print(f"goal hpc --help >= 5x faster: {'met' if help_ok else 'NOT met'}; "
          f"goal validate faster than pcluster version: {'met' if validate_ok else 'NOT met'}; "
          f"goal diff faster than pcluster version: {'met' if diff_ok else 'NOT met'}")


if __name__ == "__main__":
    main()
