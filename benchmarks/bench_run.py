#!/usr/bin/env python3
"""`hpc run` vs hand-written sbatch scripts: submit-to-all-ranks-joined, both launcher styles, in one run.

Each repeat times, for each of four ways in turn, from starting the submitting command to the moment rank 0 of
benchmarks/payloads/joined_env.py (a script written for torchrun: env:// gloo group, then a barrier) had joined:
  hand-written sbatch + srun        the torch variables exported per task by hand (what users write today)
  hpc run (script)                  `hpc run joined_env.py --nodes N`
  hand-written sbatch + torchrun    one torchrun per node, c10d rendezvous on the first node
  hpc run --launcher torchrun
Prints the medians side by side, each hpc way's ratio to its hand-written counterpart (goal <= 1.10x), and the
same as JSON (--json FILE). Needs a Slurm cluster (SLURM_CONF and HPC_CLUSTER_CONFIG: `make bench` points
them at the local one) and torch (make train-env).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_submit import timed  # noqa: E402  (same timing as the recipe benchmark)

REPO = Path(__file__).resolve().parents[1]
PAYLOAD = REPO / "benchmarks" / "payloads" / "joined_env.py"
HEAD = """#!/bin/bash
#SBATCH --partition={queue}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={tasks}
#SBATCH --cpus-per-task={cpus}
#SBATCH --time=5
#SBATCH --output={out}/hand-%j.out
NODES="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"
export MASTER_ADDR="${{NODES%%$'\\n'*}}" MASTER_PORT=$(( 15000 + SLURM_JOB_ID % 16000 ))
"""
HAND_SRUN = HEAD + """srun --cpus-per-task=1 bash -c 'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID \\
  WORLD_SIZE=$SLURM_NTASKS exec {python} {payload} --out "$0"' "$1"
"""
HAND_TORCHRUN = HEAD + """srun --cpus-per-task={cpus} {python} -m torch.distributed.run --nnodes {nodes} \\
  --nproc-per-node {ranks} --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \\
  --rdzv-id "$SLURM_JOB_ID" {payload} --out "$1"
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--queue", default="cpu")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--ranks-per-node", type=int, default=2, help="as the queue declares (cpu: 2)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    work = Path(tempfile.mkdtemp(prefix="bench-run-"))
    env = dict(os.environ, HPC_RUNS_DIR=str(work / "runs"), PYTHONPATH=str(REPO))
    fill = dict(queue=args.queue, nodes=args.nodes, out=work, python=sys.executable, payload=PAYLOAD,
                ranks=args.ranks_per_node)
    scripts = {"srun": HAND_SRUN.format(**fill, tasks=args.ranks_per_node, cpus=1),
               "torchrun": HAND_TORCHRUN.format(**fill, tasks=1, cpus=args.ranks_per_node)}
    for name, text in scripts.items():
        (work / f"hand-{name}.sbatch").write_text(text)

    def hpc(style: str, marker: Path) -> list[str]:
        return [sys.executable, "-m", "toolkit", "run", str(PAYLOAD), "--nodes", str(args.nodes), "--queue",
                args.queue, "--launcher", style, "--time", "00:05:00", "--", "--out", str(marker)]

    ways: dict[str, list[float]] = {"hand-written sbatch + srun": [], "hpc run (script)": [],
                                    "hand-written sbatch + torchrun": [], "hpc run --launcher torchrun": []}
    order = (("hand-written sbatch + srun", lambda m: ["sbatch", str(work / "hand-srun.sbatch"), str(m)]),
             ("hpc run (script)", lambda m: hpc("script", m)),
             ("hand-written sbatch + torchrun", lambda m: ["sbatch", str(work / "hand-torchrun.sbatch"), str(m)]),
             ("hpc run --launcher torchrun", lambda m: hpc("torchrun", m)))
    for i in range(args.repeats):
        for name, argv_of in order:
            marker = work / f"{len(ways[name])}-{name.replace(' ', '_')}"
            ways[name].append(timed(argv_of(marker), marker, env))
        print(f"repeat {i + 1}/{args.repeats}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in ways.items()),
              file=sys.stderr)
    medians = {k: statistics.median(v) for k, v in ways.items()}
    pairs = {"script": ("hpc run (script)", "hand-written sbatch + srun"),
             "torchrun": ("hpc run --launcher torchrun", "hand-written sbatch + torchrun")}
    ratios = {style: medians[ours] / medians[hand] for style, (ours, hand) in pairs.items()}
    ranks = args.nodes * args.ranks_per_node
    print(f"submit -> all {ranks} ranks joined (env:// script), median of {args.repeats}:")
    print(f"  {'launcher':<10}{'hand-written':>14}{'hpc run':>10}{'ratio':>8}  goal <= 1.10x")
    for style, (ours, hand) in pairs.items():
        ok = "met" if ratios[style] <= 1.10 else "NOT met"
        print(f"  {style:<10}{medians[hand]:>12.2f} s{medians[ours]:>8.2f} s{ratios[style]:>7.2f}x  {ok}")
    if args.json:
        args.json.write_text(json.dumps({"repeats": args.repeats, "ranks": ranks, "seconds": ways,
                                         "medians": medians, "ratios": ratios}, indent=2) + "\n")


if __name__ == "__main__":
    main()
