"""The `hpc run` benchmark payload: a user script written for torchrun (env:// init) joins one gloo group.

Rank 0 writes the wall-clock time at which the group had formed (after a barrier) to --out. The same script
runs under `hpc run` (both launcher styles) and the hand-written sbatch scripts (benchmarks/bench_run.py).
"""

import argparse
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
out = parser.parse_args().out

import torch.distributed as dist  # noqa: E402  (after argument parsing, as a trainer would)

dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
dist.barrier()
if dist.get_rank() == 0:
    with open(out + ".tmp", "w") as handle:
        handle.write(f"{time.time()}\n")
    os.replace(out + ".tmp", out)
dist.destroy_process_group()
