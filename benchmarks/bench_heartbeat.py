#!/usr/bin/env python3
"""Heartbeats (toolkit.node.heartbeat), measured on this machine against a baseline in the same run:

  overhead     our ResNet trainer (resnet18, smoke images, 1 rank, CPU) for --steps steps, with and without
               HPC_HEARTBEAT_DIR, alternated --repeats times: the median step time of each and their ratio
               (goal <= 1.01x), and beat()'s own cost per call
  detection    a rank that beats every 50 ms stops; how long after the stall threshold `hpc jobs status`'s
               reading (diagnose() over the files) names it, in heartbeat intervals (goal <= 2)
  false alarms --clean runs of 4 local ranks with jittery steps (a 3x slower step now and then, like a checkpoint
               save), each under a hang timeout of 10 step times: hang records written (goal 0)

Prints a table and the same as JSON (--json FILE). No Slurm needed (ranks are local processes, as under
submitit's local executor); torch and torchvision (make train-env) for the overhead part.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from toolkit.node import heartbeat  # noqa: E402


def trainer_step_seconds(data: Path, steps: int, beats: bool, work: Path) -> float:
    """Median seconds per step of one trainer run (from its own train log's intervals)."""
    log_dir = work / f"log-{beats}-{time.monotonic_ns()}"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env.pop(heartbeat.DIR_VAR, None)
    if beats:
        env[heartbeat.DIR_VAR] = str(work / "heartbeats")
        env[heartbeat.INTERVAL_VAR] = "1"
    subprocess.run([sys.executable, "-m", "toolkit.workloads.resnet", "--data", str(data), "--arch", "resnet18",
                    "--image-size", "64", "--batch-size", "8", "--workers", "0", "--crop-scale-min", "0.5",
                    "--epochs", "1000", "--max-steps", str(steps), "--log-every-steps", "1", "--threads", "1",
                    "--log-dir", str(log_dir)], env=env, check=True, capture_output=True)
    records = [json.loads(line) for line in (log_dir / "train_log.jsonl").read_text().splitlines()]
    seconds = [r["interval_seconds"] for r in records if r.get("event") == "train"][2:]  # past the warm-up
    return statistics.median(seconds)


def overhead(steps: int, repeats: int) -> dict:
    from toolkit.workloads import smoke_data

    work = Path(tempfile.mkdtemp(prefix="bench-heartbeat-"))
    data, _ = smoke_data.ensure("images", work / "images")
    plain, beating = [], []
    for _ in range(repeats):
        plain.append(trainer_step_seconds(data, steps, False, work))
        beating.append(trainer_step_seconds(data, steps, True, work))
    hb = heartbeat.Heartbeat(work / "calls", 0, interval=3600)
    calls = 200_000
    start = time.perf_counter()
    for step in range(calls):
        hb.beat(step)
    per_call = (time.perf_counter() - start) / calls
    return {"step_s_without": statistics.median(plain), "step_s_with": statistics.median(beating),
            "ratio": statistics.median(beating) / statistics.median(plain), "beat_call_us": per_call * 1e6}


def detection(trials: int, interval: float, after_s: float) -> dict:
    """Seconds from the moment a rank's no-progress time reaches `after_s` to the moment the files say so."""
    late = []
    for trial in range(trials):
        directory = Path(tempfile.mkdtemp(prefix="bench-detect-"))
        hb = heartbeat.Heartbeat(directory, 0, interval=interval).start()
        for step in range(1, 5 + trial % 3):
            hb.beat(step)
            time.sleep(0.05)
        stalled_at = hb.progress + after_s
        while not heartbeat.diagnose(heartbeat.read_beats(directory), time.time(), after_s).stalled:
            time.sleep(0.02)
        late.append(time.time() - stalled_at)
        hb.stop()
    return {"trials": trials, "interval_s": interval, "median_intervals": statistics.median(late) / interval,
            "max_intervals": max(late) / interval}


CLEAN_RANK = """
import random, sys, time
from toolkit.node.heartbeat import beat
rng = random.Random(int(sys.argv[1]))
for step in range(1, int(sys.argv[2]) + 1):
    time.sleep(0.05 * (3 if rng.random() < 0.05 else 1) * rng.uniform(0.8, 1.2))
    beat(step)
"""


def false_alarms(runs: int, steps: int) -> dict:
    alarms = 0
    for run in range(runs):
        directory = Path(tempfile.mkdtemp(prefix="bench-clean-"))
        env = dict(os.environ, PYTHONPATH=str(REPO), WORLD_SIZE="4", **{
            heartbeat.DIR_VAR: str(directory / "heartbeats"), heartbeat.INTERVAL_VAR: "0.1",
            heartbeat.HANG_VAR: "0.5"})
        env.pop("SLURM_JOB_ID", None)
        ranks = [subprocess.Popen([sys.executable, "-c", CLEAN_RANK, str(run * 10 + r), str(steps)],
                                  env=dict(env, RANK=str(r))) for r in range(4)]
        codes = [r.wait(timeout=120) for r in ranks]
        alarms += (directory / heartbeat.HANG_FILE).exists() or any(codes)
    return {"runs": runs, "false_alarms": alarms}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--clean", type=int, default=20)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    out = {}
    print("heartbeat detection (a rank stops beating)...", flush=True)
    out["detection"] = detection(10, interval=0.5, after_s=1.0)
    print(f"clean runs for false alarms ({args.clean})...", flush=True)
    out["false_alarms"] = false_alarms(args.clean, steps=40)
    print(f"trainer overhead ({args.repeats} x 2 runs of {args.steps} steps)...", flush=True)
    out["overhead"] = overhead(args.steps, args.repeats)
    o, d, f = out["overhead"], out["detection"], out["false_alarms"]
    rows = [("trainer step, no heartbeat (baseline)", f"{o['step_s_without'] * 1e3:.1f} ms", ""),
            ("trainer step, with heartbeat", f"{o['step_s_with'] * 1e3:.1f} ms", f"{o['ratio']:.3f}x (goal <= 1.01x)"),
            ("beat() per call", f"{o['beat_call_us']:.2f} us", ""),
            ("stall named after the threshold", f"median {d['median_intervals']:.2f}, max {d['max_intervals']:.2f} "
                                                "intervals", "goal <= 2"),
            ("false alarms over clean runs", f"{f['false_alarms']} in {f['runs']}", "goal 0")]
    width = max(len(r[0]) for r in rows)
    for name, value, goal in rows:
        print(f"{name:<{width}}  {value:<28} {goal}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
