"""A DDP training loop (gloo, CPU) in which one rank gets stuck in its data loading: a fault made for real.

    stuck_rank.py --steps N --step-seconds S --stuck-rank R --stuck-at STEP

Every step beats (toolkit.workloads.heartbeat, the two-line helper). At step STEP, rank R never returns from
load_batch(), as a rank whose loader waits on a dead file system would; the other ranks block in DDP's gradient
all-reduce of that step, waiting for it. Without --stuck-rank it trains to the end (a clean run).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from toolkit.workloads.heartbeat import beat


def load_batch(step, rank, stuck_rank, stuck_at):
    if rank == stuck_rank and step >= stuck_at:
        while True:  # stuck: a read that never returns
            time.sleep(1)
    return torch.randn(8, 4)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--step-seconds", type=float, default=0.1)
    p.add_argument("--stuck-rank", type=int, default=-1)
    p.add_argument("--stuck-at", type=int, default=0)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, args.steps + 1):
        x = load_batch(step, rank, args.stuck_rank, args.stuck_at)
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
        time.sleep(args.step_seconds)
        beat(step)
    dist.destroy_process_group()
    print(f"rank {rank} done ({os.environ.get('SLURMD_NODENAME')})", flush=True)


if __name__ == "__main__":
    main()
