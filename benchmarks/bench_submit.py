#!/usr/bin/env python3
"""Submit-to-joined: `hpc recipes submit` vs a hand-written sbatch + srun script, same payload, same cluster.

Each repeat times from starting the submitting command to the moment rank 0 of the payload
(benchmarks/payloads/joined.py: a torch.distributed gloo process group) had formed; the two ways alternate.
Prints the medians and the ratio (goal: hpc <= 1.10x the hand-written script). Needs the local Slurm
(make slurm-up) or a cluster with a `cpu`-like queue (--queue, --nodes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PAYLOAD = REPO / "benchmarks" / "payloads" / "joined.py"
HAND_SCRIPT = """#!/bin/bash
#SBATCH --partition={queue}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={tasks}
#SBATCH --cpus-per-task=1
#SBATCH --time=5
#SBATCH --output={out}/hand-%j.out
NODES="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"
export MASTER_ADDR="${{NODES%%$'\\n'*}}" MASTER_PORT=$(( 15000 + SLURM_JOB_ID % 16000 ))
srun --cpus-per-task=1 {payload} --out "$1"
"""


def wait_for(path: Path, timeout: float = 180) -> float:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"no rendezvous within {timeout:.0f} s ({path} missing): is the cluster up?")
        time.sleep(0.02)
    return float(path.read_text())


def timed(argv: list[str], marker: Path, env: dict[str, str]) -> float:
    start = time.time()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return wait_for(marker) - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--queue", default="cpu")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--tasks-per-node", type=int, default=2)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from toolkit.slurm.discovery import use_discovered_slurm

    use_discovered_slurm()
    work = Path(tempfile.mkdtemp(prefix="bench-submit-"))
    env = dict(os.environ, HPC_RUNS_DIR=str(work / "runs"), PYTHONPATH=str(REPO))
    # One executable both ways: this Python (with torch) running the payload.
    payload = work / "joined"
    payload.write_text(f"#!/bin/sh\nexec {sys.executable} {PAYLOAD} \"$@\"\n")
    payload.chmod(0o755)
    hand = work / "hand.sbatch"
    hand.write_text(HAND_SCRIPT.format(queue=args.queue, nodes=args.nodes, tasks=args.tasks_per_node, out=work,
                                       payload=payload))
    ways: dict[str, list[float]] = {"hand-written sbatch + srun": [], "hpc recipes submit": []}
    for i in range(args.repeats):
        marker = work / f"hand-{i}"
        ways["hand-written sbatch + srun"].append(timed(["sbatch", str(hand), str(marker)], marker, env))
        marker = work / f"hpc-{i}"
        recipe = work / f"joined-{i}.yaml"
        recipe.write_text(yaml.safe_dump({
            "name": "joined", "description": "rendezvous timing payload", "source": "benchmarks",
            "launcher": {"kind": "binary", "program": str(payload)}, "args": {"--out": str(marker)},
            "resources": {"nodes": args.nodes, "time": "00:05:00", "exclusive": False}}))
        ways["hpc recipes submit"].append(timed(
            [sys.executable, "-m", "toolkit", "recipes", "submit", str(recipe), "--nodes", str(args.nodes),
             "--queue", args.queue], marker, env))
        print(f"repeat {i + 1}/{args.repeats}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in ways.items()),
              file=sys.stderr)
    medians = {k: statistics.median(v) for k, v in ways.items()}
    base = medians["hand-written sbatch + srun"]
    print(f"submit -> all {args.nodes * args.tasks_per_node} ranks joined, median of {args.repeats}:")
    for name, seconds in medians.items():
        print(f"  {name:<30}{seconds:>8.2f} s  {seconds / base:>6.2f}x")
    ratio = medians["hpc recipes submit"] / base
    print(f"goal hpc <= 1.10x hand-written: {'met' if ratio <= 1.10 else 'NOT met'} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
