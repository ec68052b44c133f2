#!/usr/bin/env python3
"""Issue 35: a bandwidth baseline learned from the fleet's own runs, against the published floor, on real runs.

Real collectives runs (toolkit.workloads.collectives: 2 gloo ranks on this machine, all_reduce at one size): the
first --learn runs are recorded into a fresh fleet ledger (`hpc report nccl --record`, what an admin does after a
healthy run); then --clean more clean runs and --slow runs whose ranks are CPU-throttled (stopped --throttle of
every 20 ms with SIGSTOP/SIGCONT, as a CPU quota throttles a node) are each judged by `hpc report nccl`: against
the fleet's baseline (toolkit.reports.baseline) and, the baseline of this comparison, against the published floor
alone (what hpc did before the fleet learned: for a 1-node m5.xlarge run there is none, so nothing is ever flagged).
Prints the false-alarm and detection rates of both. This machine's 2 cores are shared with whatever else runs, so
a clean run here can be slow for reasons of its own: say what else ran.

`--save DIR` keeps every run's log (tests/data/fleet-baseline was made this way, for tests/test_ledger.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def gloo_run(size: str, throttle: float = 0.0) -> str:
    """One real collectives run of 2 gloo ranks here; with `throttle`, each rank stopped that fraction of every
    20 ms. Rank 0's output (nccl-tests' table format)."""
    port, procs = str(free_port()), []
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
        procs.append(subprocess.Popen([sys.executable, "-m", "toolkit.workloads.collectives", "-b", size, "-e", size,
                                       "-n", "20", "-w", "3"], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd=REPO))
    done = threading.Event()

    def send(sig: int) -> None:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):  # a rank that just ended
                os.kill(p.pid, sig)

    def throttler() -> None:
        while not done.is_set():
            send(signal.SIGSTOP)
            time.sleep(0.02 * throttle)
            send(signal.SIGCONT)
            time.sleep(0.02 * (1 - throttle))

    thread = threading.Thread(target=throttler)
    if throttle:
        thread.start()
    try:
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        done.set()
        if throttle:
            thread.join()
            send(signal.SIGCONT)
    if [p.returncode for p in procs] != [0, 0]:
        raise SystemExit(f"a collectives run failed:\n{outs[0][1][-2000:]}")
    return outs[0][0]


def judge(log: Path, env: dict[str, str], record: bool = False) -> dict:
    argv = [sys.executable, "-m", "toolkit", "report", "nccl", str(log), "--instance", "m5.xlarge", "--nodes", "1",
            "--json", *(["--record"] if record else [])]
    res = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=REPO, timeout=120)
    if res.returncode not in (0, 1):
        raise SystemExit(f"hpc report nccl failed: {res.stderr}")
    return json.loads(res.stdout)["data"]["tests"][0]["verdict"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learn", type=int, default=5, help="clean runs the fleet learns from")
    parser.add_argument("--clean", type=int, default=5, help="clean runs judged")
    parser.add_argument("--slow", type=int, default=5, help="throttled runs judged")
    parser.add_argument("--throttle", type=float, default=0.6, help="fraction of every 20 ms a slow run is stopped")
    parser.add_argument("--size", default="32M",
                        help="long enough that the throttle shows (a 1 MiB all_reduce fits between two stops)")
    parser.add_argument("--save", type=Path, help="keep every run's log here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-baseline-"))
    fleet_env = dict(os.environ, HPC_FLEET_DIR=str(work / "fleet"), PYTHONPATH=str(REPO))
    floor_env = dict(os.environ, HPC_FLEET_DIR=str(work / "no-fleet"), PYTHONPATH=str(REPO))
    runs: list[tuple[str, Path]] = []
    for kind, count in (("learn", args.learn), ("clean", args.clean), ("slow", args.slow)):
        for i in range(count):
            log = work / f"{kind}{i}.out"
            log.write_text(gloo_run(args.size, args.throttle if kind == "slow" else 0.0))
            runs.append((kind, log))
            if kind == "learn":
                judge(log, fleet_env, record=True)
            print(f"{kind} run {i + 1}/{count} done", file=sys.stderr)
    flagged: dict[str, dict[str, int]] = {"fleet baseline": {}, "published floor": {}}
    for kind, log in runs:
        if kind == "learn":
            continue
        for name, env in (("fleet baseline", fleet_env), ("published floor", floor_env)):
            verdict = judge(log, env)
            flagged[name][kind] = flagged[name].get(kind, 0) + (verdict["status"] == "FAIL")
        print(f"{log.name}: judged", file=sys.stderr)
    print(f"all_reduce {args.size}, 2 gloo ranks here; fleet learned from {args.learn} clean runs; "
          f"slow = stopped {args.throttle:.0%} of every 20 ms")
    print(f"  {'judged by':<18}{'false alarms (clean)':>22}{'detected (slow)':>18}")
    for name, counts in flagged.items():
        print(f"  {name:<18}{counts.get('clean', 0):>14} of {args.clean:<5}{counts.get('slow', 0):>11} of {args.slow}")
    base, ours = flagged["published floor"].get("slow", 0), flagged["fleet baseline"].get("slow", 0)
    print(f"detection: fleet baseline {ours}/{args.slow} vs published floor {base}/{args.slow}")
    if args.save:
        args.save.mkdir(parents=True, exist_ok=True)
        for _, log in runs:
            shutil.copyfile(log, args.save / log.name)
        print(f"logs saved in {args.save}")


if __name__ == "__main__":
    main()
