"""Data-parallel training the way PyTorch's DDP tutorial writes it, plus checkpoints: a script for `hpc run`.

    hpc run recipes/examples/ddp_train.py --nodes 2 --wait -- --steps 60
    hpc run recipes/examples/ddp_train.py --nodes 2 --launcher torchrun --max-restarts 2 --wait

It reads only the torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT via env://),
so it runs unchanged under `torchrun` too. Every --checkpoint-every steps rank 0 saves model, optimizer and
step; at start every rank resumes from the newest checkpoint (after a torchrun restart or a Slurm requeue).
Rank 0 prints one JSON line per --log-every steps ({"event": "train", ...}) that `hpc report run` reads.
Each step ends with beat(step) (toolkit.workloads.heartbeat): `hpc jobs status` then names a rank that stops
progressing, and --hang-timeout ends a hung job naming it; a save's seconds go with it (beat(step, checkpoint=s))
and into a {"event": "checkpoint"} line, so `hpc report goodput` tells saves from steps. Outside an hpc job it does nothing.
"""

import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from toolkit.workloads.heartbeat import beat


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep per step (to make a run last)")
    parser.add_argument("--pid-dir", default=None, help="write <pid-dir>/rank-R.pid (tests kill a worker by it)")
    return parser.parse_args()


def emit(record):
    """One JSON line in one write, with its time (Unix seconds): under torchrun a node's ranks share a log, and
    print() writes the text and the newline separately, so two ranks' lines could interleave."""
    sys.stdout.write(json.dumps({**record, "time": round(time.time(), 3)}) + "\n")
    sys.stdout.flush()


def checkpoint_path(directory):
    return os.path.join(directory, "checkpoint.pt")


def main():
    args = parse_args()
    dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    emit({"event": "rank_env", "rank": rank, "local_rank": local_rank, "world_size": world_size,
                      "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                             "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                                                             "TORCHELASTIC_RESTART_COUNT")},
                      "host": socket.gethostname(), "pid": os.getpid()})
    if args.pid_dir:
        os.makedirs(args.pid_dir, exist_ok=True)
        with open(os.path.join(args.pid_dir, f"rank-{rank}.pid"), "w") as handle:
            handle.write(str(os.getpid()))

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    start = 0
    path = checkpoint_path(args.checkpoint_dir)
    if os.path.exists(path):  # resume: every rank loads the same checkpoint
        state = torch.load(path, map_location="cpu")
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
        if rank == 0:
            emit({"event": "resumed", "step": start})

    true_w = torch.randn(16, 1, generator=torch.Generator().manual_seed(1))
    data = torch.Generator().manual_seed(100 + rank)
    loss_fn = nn.MSELoss()
    window_loss, window_start = 0.0, time.monotonic()
    for step in range(start + 1, args.steps + 1):
        x = torch.randn(args.batch_size, 16, generator=data)
        y = x @ true_w
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        window_loss += loss.item()
        if args.step_seconds:
            time.sleep(args.step_seconds)
        if step % args.log_every == 0:
            mean = torch.tensor([window_loss / args.log_every])
            dist.all_reduce(mean)
            seconds = time.monotonic() - window_start
            if rank == 0:
                emit({"event": "train", "step": step, "loss": mean.item() / world_size,
                                  "world_size": world_size, "interval_images": args.log_every * args.batch_size
                                  * world_size, "interval_seconds": seconds})
            window_loss, window_start = 0.0, time.monotonic()
        saved = None
        if step % args.checkpoint_every == 0 and rank == 0:
            began = time.monotonic()
            os.makedirs(args.checkpoint_dir, exist_ok=True)
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                       path + ".tmp")
            os.replace(path + ".tmp", path)  # never a half-written checkpoint
            saved = time.monotonic() - began
            emit({"event": "checkpoint", "step": step, "seconds": round(saved, 3)})
        beat(step, checkpoint=saved)  # the save's time too: `hpc report goodput` counts it apart from the steps
    dist.barrier()
    if rank == 0:
        emit({"event": "end", "step": args.steps, "status": "completed"})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
