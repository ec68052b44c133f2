#!/usr/bin/env python3
"""The bad-node search and the pre-flight, on the local Slurm's `wide` nodes (16 one-CPU slurmds), in one run.

Prints, each against its baseline:
  rounds to find 1 slow node among 8 and 16  `hpc cluster find-bad-nodes` with one node made slow for real (a CPU
                                              limit on its slurmd and its steps: testbench.faults.slow_node), a
                                              different node each trial; against ceil(log2 N) + 2 (the goal) and
                                              all pairs' N(N-1)/2 runs
  false alarms over clean searches           the same search on 8 healthy nodes (goal: 0)
  rounds by the model                        the search against a stand-in cluster (toolkit.health.nodesearch with
                                              a bandwidth model, no Slurm): every slow position for N = 8, 16, 32, 64
  pre-flight time                            the pre-flight's own seconds (its record) on 2 and 8 nodes, and a short
                                              job's time from submission to its end with and without it
Needs the local Slurm (make slurm-up) and torch (make train-env); `make bench` runs it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testbench.cluster import slurm_env  # noqa: E402
from testbench.faults import slow_node  # noqa: E402
from testbench.layout import Layout  # noqa: E402
from toolkit.health.nodesearch import GroupRun, max_rounds, search  # noqa: E402
from toolkit.rundir import RunDir  # noqa: E402

PRINT_ENV = REPO / "tests" / "payloads" / "print_env.py"


def hpc(*args: str, env: dict, ok=(0,)) -> dict:
    res = subprocess.run([sys.executable, "-m", "toolkit", *args, "--json"], capture_output=True, text=True,
                         env=env, timeout=1800)
    if res.returncode not in ok:
        raise SystemExit(f"hpc {' '.join(args[:3])} failed: {res.stdout}{res.stderr}")
    return json.loads(res.stdout)["data"]


def find(nodes: int, env: dict, slow: str | None, fraction: float, size: str) -> dict:
    # One group run at a time: the simulated nodes share this machine's cores, so concurrent runs would slow each
    # other and hide the slow node (on a cluster a round's groups run at once, on their own hardware).
    args = ["cluster", "find-bad-nodes", "-p", "wide", "--nodelist", f"w[1-{nodes}]", "--size", size, "--iters", "10",
            "--concurrency", "1", "--venv", sys.prefix]  # the ranks' python: this venv (torch, the toolkit)
    if slow is None:
        return hpc(*args, env=env, ok=(0, 1))
    with slow_node(slow, fraction):
        return hpc(*args, env=env, ok=(0, 1))


def live(args, env: dict) -> None:
    print(f"\n== slow node among N (CPU limit {args.fraction} of a CPU), {args.trials} trial(s) each ==")
    print(f"{'N':>3} {'trial':>5} {'slow':>5} {'found':>12} {'rounds':>6} {'goal':>4} {'all pairs':>9} {'s':>5}")
    for n in (8, 16):
        rounds = []
        for trial in range(args.trials):
            slow = f"w{random.Random(n * 100 + trial).randint(2, n)}"  # w1 runs the search's batch shell
            start = time.monotonic()
            data = find(n, env, slow, args.fraction, args.size)
            found = ",".join(sorted(data["bad"])) or "-"
            rounds.append(len(data["rounds"]))
            print(f"{n:>3} {trial:>5} {slow:>5} {found:>12} {len(data['rounds']):>6} {max_rounds(n):>4} "
                  f"{math.comb(n, 2):>9} {time.monotonic() - start:>5.0f}", flush=True)
        print(f"    N={n}: rounds median {statistics.median(rounds):g}, max {max(rounds)}; goal {max_rounds(n)}; "
              f"all pairs {math.comb(n, 2)} runs ({math.comb(n, 2) / max(rounds):.0f}x the rounds)")
    print(f"\n== false alarms over {args.clean} clean search(es) of 8 nodes ==")
    alarms = sum(len(find(8, env, None, 1.0, args.size)["bad"]) for _ in range(args.clean))
    print(f"    nodes flagged: {alarms} in {args.clean} searches (goal 0)")


def model() -> None:
    print("\n== rounds by the model (a stand-in cluster: the slowest node paces a group, +-25% noise) ==")
    print(f"{'N':>3} {'group':>6} {'rounds max':>10} {'goal':>4} {'runs max':>8} {'all pairs':>9} {'found':>7}")
    for n in (8, 16, 32, 64):
        for group in (2, n // 2):
            worst_rounds = worst_runs = found = 0
            for position in range(n):
                rng = random.Random(position)
                bad = f"n{position}"
                calls = []

                def measure(number, groups, rng=rng, bad=bad, calls=calls):
                    calls.append(len(groups))
                    return [GroupRun(tuple(g), 10 * (0.3 if bad in g else 1.0) * (1 + rng.uniform(-0.25, 0.25)))
                            for g in groups]
                result = search([f"n{i}" for i in range(n)], measure, group)
                found += set(result.bad) == {bad}
                worst_rounds, worst_runs = max(worst_rounds, len(result.rounds)), max(worst_runs, sum(calls))
            print(f"{n:>3} {group:>6} {worst_rounds:>10} {max_rounds(n):>4} {worst_runs:>8} {math.comb(n, 2):>9} "
                  f"{found:>4}/{n}")


def preflight(env: dict, tmp: Path) -> None:
    print("\n== pre-flight ==")
    for nodes in (2, 8):
        seconds = []
        for _ in range(3):
            job = hpc("run", str(PRINT_ENV), "--nodes", str(nodes), "--queue", "wide", "--time", "5", "--wait",
                      env=env)
            seconds += [r["seconds"] for r in RunDir(job["run_dir"]).preflights()]
        print(f"    {nodes} nodes: pre-flight {statistics.median(seconds):.2f} s median of {len(seconds)} "
              f"(goal < 30 s)")
    totals = {}
    for flag in ("--preflight", "--no-preflight"):
        times = []
        for _ in range(3):
            start = time.monotonic()
            hpc("run", str(PRINT_ENV), "--nodes", "2", "--queue", "wide", "--time", "5", "--wait", flag, env=env)
            times.append(time.monotonic() - start)
        totals[flag] = statistics.median(times)
    print(f"    a 2-node job, submission to end: {totals['--preflight']:.1f} s with, {totals['--no-preflight']:.1f} s "
          f"without ({totals['--preflight'] / totals['--no-preflight']:.2f}x)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--clean", type=int, default=3)
    parser.add_argument("--fraction", type=float, default=0.1, help="the slow node's CPU limit")
    parser.add_argument("--size", default="1M")
    parser.add_argument("--model-only", action="store_true")
    args = parser.parse_args()
    # SIGTERM as an exception: a slow node's CPU limit is lifted (testbench.faults.slow_node's finally) on a kill too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    model()
    if args.model_only:
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, **slurm_env(Layout.current()), HPC_RUNS_DIR=str(Path(tmp) / "runs"))
        preflight(env, Path(tmp))
        live(args, env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
