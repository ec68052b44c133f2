#!/usr/bin/env python3
"""`hpc plan` predicted vs measured on the local Slurm: calibrate the smoke ResNet at 1 and 2 nodes of the `wide`
partition (`hpc plan calibrate`), predict 4 and 8 nodes (`hpc plan`), run them, print both side by side and the
ratio predicted / measured (goal: within 20%).

The 16 `wide` nodes are processes on one machine's cores: they share them, as real nodes never do. The prediction
is printed twice: as for separate nodes (the planner's default), and told the bench's fact
(`--assume shared_host=true`: the ranks' own work grows as the forward pass did from 1 to 2 nodes).
Needs SLURM_CONF and HPC_CLUSTER_CONFIG pointed at the local cluster (`eval "$(python -m testbench env)"`) and the
lock other Slurm users of the bench take: `flock /tmp/hpc-slurm-e2e.lock python benchmarks/bench_planner.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Each run: the smoke ResNet for a step budget (20 epochs of the small digits set, so no run ends at an epoch first)
SETS = ["--set", "args.--epochs=20", "--set", "args.--log-every-steps=2"]


def hpc(*args: str, env: dict[str, str], cwd: Path) -> dict:
    res = subprocess.run([sys.executable, "-m", "toolkit", *args, "--json"], capture_output=True, text=True, env=env,
                         cwd=cwd, timeout=1800)
    doc = json.loads(res.stdout)
    if not doc["ok"]:
        sys.exit(f"hpc {' '.join(args)} failed: {doc['error']}\n{res.stderr[-2000:]}")
    return doc["data"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="updates per run (default 30)")
    parser.add_argument("--predict", default="4,8", help="node counts to predict and run (default 4,8)")
    args = parser.parse_args()
    if not os.environ.get("SLURM_CONF") or not os.environ.get("HPC_CLUSTER_CONFIG"):
        sys.exit('point SLURM_CONF and HPC_CLUSTER_CONFIG at the local cluster: eval "$(python -m testbench env)"')
    work = Path(tempfile.mkdtemp(prefix="bench-planner-"))
    env = dict(os.environ, HPC_RUNS_DIR=str(work / "runs"), PYTHONPATH=str(REPO))
    steps = ["--steps", str(args.steps)]
    base = ["resnet50", "--profile", "smoke", "--queue", "wide"]
    calibration = hpc("plan", "calibrate", *base, "--nodes", "1,2", *steps, *SETS, env=env, cwd=work)
    print(f"calibrated: {calibration['record']}", file=sys.stderr)
    counts = [int(n) for n in args.predict.split(",")]
    nodes = ",".join(str(n) for n in [1, 2, *counts])
    plain = hpc("plan", *base, "--nodes", nodes, *SETS, "--set", f"args.--max-steps={args.steps}", env=env, cwd=work)
    shared = hpc("plan", *base, "--nodes", nodes, *SETS, "--set", f"args.--max-steps={args.steps}", "--assume",
                 "shared_host=true", env=env, cwd=work)
    measured = {}
    for n in counts:
        run = hpc("recipes", "submit", *base, "--nodes", str(n), *SETS, "--set", f"args.--max-steps={args.steps}",
                  "--wait", env=env, cwd=work)
        report = hpc("report", "run", run["run_dir"], env=env, cwd=work)
        measured[n] = report["training"]["throughput"]
    rows = {r["nodes"]: r for r in plain["rows"]}
    rows_shared = {r["nodes"]: r for r in shared["rows"]}
    print(f"{'nodes':>5}  {'measured img/s':>14}  {'predicted':>9}  {'ratio':>6}  {'pred. shared host':>17}  "
          f"{'ratio':>6}  bound (shared host)")
    for n in [1, 2]:
        print(f"{n:>5}  {'(calibration)':>14}  {rows[n]['throughput']:>9.1f}  {'':>6}  "
              f"{rows_shared[n]['throughput']:>17.1f}")
    worst = 0.0
    for n in counts:
        ratio, ratio_shared = rows[n]["throughput"] / measured[n], rows_shared[n]["throughput"] / measured[n]
        worst = max(worst, abs(ratio_shared - 1))
        print(f"{n:>5}  {measured[n]:>14.1f}  {rows[n]['throughput']:>9.1f}  {ratio:>5.2f}x  "
              f"{rows_shared[n]['throughput']:>17.1f}  {ratio_shared:>5.2f}x  {rows_shared[n]['bound']}")
    print(f"worst error (shared host): {worst:.0%} (goal: within 20%)")
    print("inputs (shared host):")
    for item in shared["inputs"]:
        print(f"  {item['name']}: {item['value']}  [{item['source']}]")


if __name__ == "__main__":
    main()
