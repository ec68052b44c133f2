#!/usr/bin/env python3
"""What a container costs a job, against plain srun in the same allocation and the same command.

1. Per job step: `srun -N2 --ntasks-per-node=2 true`, plain vs with pyxis's --container-image (and with the mounts
   a job of ours passes: this machine's Python, venv and checkout). pyxis unpacks the image on every node for
   every step: this is what each srun of a job pays (the job's prepare step and its ranks' step).
2. Per training step inside the step: 4 ranks each time a small torch loop (matmuls, ms per iteration) on the host
   and in the container (the same Python, mounted): the container should cost nothing once the ranks run.

The two ways alternate; medians and the ratio are printed. Needs the container lane (`python -m testbench up
--slurm 22.05-pyxis`, make container-lane), whose SLURM_CONF it uses; the image is the lane's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOOP = ("import time, torch; torch.set_num_threads(1); a = torch.randn(256, 256); t = time.perf_counter(); "
        "[a @ a for _ in range({n})]; print((time.perf_counter() - t) / {n} * 1e3)")


def lane_env() -> tuple[dict[str, str], Path]:
    sys.path.insert(0, str(REPO))
    from testbench import containers, discover
    from testbench.layout import Layout

    sandbox = discover(Layout.current("22.05-pyxis"))
    if sandbox is None:
        raise SystemExit("the container lane is not up: python -m testbench up --slurm 22.05-pyxis")
    return sandbox.env(), containers.image_path()


def mounts() -> str:
    import torch

    paths = sorted({sys.prefix, sys.base_prefix, str(Path(torch.__file__).parents[1]), str(REPO)})
    keep = [p for p in paths if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in paths)]
    return ",".join(f"{p}:{p}" for p in keep)


def step(env: dict[str, str], job: str, extra: list[str], command: list[str]) -> tuple[float, str]:
    argv = ["srun", f"--jobid={job}", "--nodes=2", "--ntasks-per-node=2", "--cpus-per-task=1", *extra, *command]
    t = time.perf_counter()
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {res.stderr.strip()}")
    return time.perf_counter() - t, res.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--iterations", type=int, default=200, help="matmuls per rank in the training-step loop")
    args = parser.parse_args()
    env, image = lane_env()
    job = subprocess.run(["salloc", "--no-shell", "--nodes=2", "--ntasks-per-node=2", "--cpus-per-task=1",
                          "--time=10", "--job-name=bench-containers"], env=env, capture_output=True, text=True,
                         timeout=120)
    job_id = next((w for w in job.stderr.split() if w.isdigit()), None)
    if job.returncode != 0 or job_id is None:
        raise SystemExit(f"salloc failed: {job.stderr.strip()}")
    image_only = [f"--container-image={image}", "--container-readonly"]
    with_mounts = [*image_only, f"--container-mounts={mounts()}"]
    ways = {"plain srun": [], "container": image_only, "container + mounts": with_mounts}
    try:
        launch = {name: [] for name in ways}
        for _ in range(args.repeats):
            for name, extra in ways.items():
                launch[name].append(step(env, job_id, extra, ["true"])[0])
        loop = [sys.executable, "-c", LOOP.format(n=args.iterations)]
        compute = {name: [] for name in ("plain srun", "container + mounts")}
        for _ in range(max(3, args.repeats // 2)):
            for name in compute:
                out = step(env, job_id, ways[name], loop)[1]
                compute[name].append(statistics.median(float(x) for x in out.split()))
    finally:
        subprocess.run(["scancel", job_id], env=env, timeout=30)
    med = {name: statistics.median(v) for name, v in launch.items()}
    print("per job step (srun -N2 --ntasks-per-node=2 true), median of", args.repeats)
    base = med["plain srun"]
    for name, value in med.items():
        more = "" if name == "plain srun" else f"   +{value - base:.2f} s, {value / base:.1f}x"
        print(f"  {name:20} {value:6.2f} s{more}")
    cmed = {name: statistics.median(v) for name, v in compute.items()}
    print("per training step (torch 256x256 matmul, 4 ranks, ms per iteration), median of",
          len(compute["plain srun"]))
    for name, value in cmed.items():
        print(f"  {name:20} {value:6.3f} ms" + ("" if name == "plain srun" else
                                               f"   ratio {value / cmed['plain srun']:.2f}x"))
    print(json.dumps({"launch_s": med, "train_step_ms": cmed}))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
