#!/usr/bin/env python3
"""hpc's straggler finding beside nvidia-resiliency-ext's straggler Detector, on CPU, in one run.

4 local ranks (gloo), a small DDP model, rank 2 doing three times the forward work of the others
(benchmarks/payloads/straggler_ddp.py), run three ways, --repeats times each, alternated:
  none   no detector (the baseline)
  hpc    toolkit.workloads.heartbeat beat(step, data=, compute=, sync=), judged by toolkit.reports.stragglers
  nvrx   nvidia-resiliency-ext 0.4.1 (the newest release for Python 3.11) Detector.detection_section("forward",
         profile_cuda=False), judged by its Report.identify_stragglers() (default thresholds)
Prints, per way: the ranks flagged and the median step time against the baseline's. NVRx needs CUPTI 12
(nvidia-cuda-cupti-cu12) to initialise even when it times on the host, and its report calls
torch.cuda.synchronize() and reads CUPTI's kernel statistics: the payload stands in for both (a no-op and no
kernels: no GPU here, nothing was queued on one).
`make bench` installs both (make bench-deps).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PAYLOAD = REPO / "benchmarks" / "payloads" / "straggler_ddp.py"
RANKS, SLOW_RANK = 4, 2


BENCH_SITE = Path(sys.prefix) / "bench-site"  # make bench-deps: NVRx and CUPTI 12, apart from the venv
CUPTI_LIB = BENCH_SITE / "nvidia" / "cuda_cupti" / "lib"


def run(mode: str, steps: int) -> tuple[float, list[int]]:
    """(median step seconds over ranks and steps past the first 5, ranks flagged) of one run."""
    from toolkit.reports.stragglers import find_stragglers
    from toolkit.node import heartbeat

    out = Path(tempfile.mkdtemp(prefix=f"bench-stragglers-{mode}-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(REPO), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               WORLD_SIZE=str(RANKS), OMP_NUM_THREADS="1")
    env.pop(heartbeat.DIR_VAR, None)
    if mode == "hpc":
        env.update({heartbeat.DIR_VAR: str(out / "heartbeats"), heartbeat.INTERVAL_VAR: "1"})
    if mode == "nvrx":
        env["PYTHONPATH"] = f"{REPO}:{BENCH_SITE}"
        env["LD_LIBRARY_PATH"] = ":".join(filter(None, [str(CUPTI_LIB), env.get("LD_LIBRARY_PATH")]))
    ranks = [subprocess.Popen([sys.executable, str(PAYLOAD), mode, str(SLOW_RANK), str(steps), str(out)],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r))) for r in range(RANKS)]
    if any(r.wait(timeout=600) for r in ranks):
        raise SystemExit(f"a {mode} rank failed")
    seconds = [s for r in range(RANKS) for s in json.loads((out / f"steps-{r}.json").read_text())[5:]]
    if mode == "hpc":
        flagged = [r.rank for r in find_stragglers(heartbeat.read_beats(out / "heartbeats")).ranks if r.slow]
    elif mode == "nvrx":
        found = json.loads((out / "nvrx.json").read_text())
        flagged = sorted({r for ranks in found["straggler_sections_relative"].values() for r in ranks})
    else:
        flagged = []
    return statistics.median(seconds), flagged


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if (BENCH_SITE / "nvidia_resiliency_ext").is_dir():
        modes: tuple[str, ...] = ("none", "hpc", "nvrx")
    else:
        print(f"nvidia-resiliency-ext is not in {BENCH_SITE} (make bench-deps): comparing hpc with no detector only")
        modes = ("none", "hpc")
    results: dict[str, dict] = {m: {"step_s": [], "flagged": []} for m in modes}
    for repeat in range(args.repeats):
        for mode in modes:
            print(f"repeat {repeat + 1}/{args.repeats}: {mode}...", flush=True)
            seconds, flagged = run(mode, args.steps)
            results[mode]["step_s"].append(seconds)
            results[mode]["flagged"].append(flagged)
    base = statistics.median(results["none"]["step_s"])
    print(f"\nrank {SLOW_RANK} of {RANKS} does 3x the forward work; {args.steps} steps, {args.repeats} runs each")
    print(f"{'detector':<8} {'ranks flagged (each run)':<28} {'median step':>12} {'vs none':>8}")
    for mode in modes:
        step = statistics.median(results[mode]["step_s"])
        flagged = " ".join(str(f) for f in results[mode]["flagged"]) if mode != "none" else "-"
        print(f"{mode:<8} {flagged:<28} {step * 1e3:>10.2f}ms {step / base:>7.3f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
