"""One Slurm task per rank: a gloo all_reduce over every rank, rendezvous at the job's first node."""

import json
import os
import socket
import subprocess

import torch
import torch.distributed as dist

torch.set_num_threads(1)
rank = int(os.environ["SLURM_PROCID"])
world = int(os.environ["SLURM_NTASKS"])
master = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                        capture_output=True, text=True, check=True, timeout=20).stdout.split()[0]
port = 20000 + int(os.environ["SLURM_JOB_ID"]) % 20000
dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=world)
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
print(json.dumps({"rank": rank, "host": socket.gethostname(), "world": dist.get_world_size(),
                  "sum": value.item()}), flush=True)
dist.destroy_process_group()
