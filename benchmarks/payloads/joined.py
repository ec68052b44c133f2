"""The benchmark payload: every rank joins one torch.distributed (gloo) process group, as training starts.

Rank 0 writes the wall-clock time at which the group had formed (after a barrier) to --out. The same
payload runs under the hand-written sbatch script and under `hpc recipes submit` (benchmarks/bench_submit.py).
"""

import argparse
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
out = parser.parse_args().out

import torch.distributed as dist  # noqa: E402  (after argument parsing, as a trainer would)

rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                        rank=rank, world_size=world)
dist.barrier()
if rank == 0:
    with open(out + ".tmp", "w") as handle:
        handle.write(f"{time.time()}\n")
    os.replace(out + ".tmp", out)
dist.destroy_process_group()
