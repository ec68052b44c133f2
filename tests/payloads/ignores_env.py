"""A user script that ignores the rank environment: its own rendezvous, a world size that never assembles.

Stand-in for the common mistake (a hard-coded init_method and world_size); it would wait in
init_process_group for peers that never come. The launcher must end it with a rendezvous timeout.
"""

import os
import sys

import torch.distributed as dist

# Each node its own store (the local nodes of the test cluster share one network: one port per node).
port = (int(sys.argv[1]) if len(sys.argv) > 1 else 29999) + int(os.environ.get("SLURM_NODEID", "0"))
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=int(os.environ.get("SLURM_LOCALID", "0")),
                        world_size=8)
print("joined (never expected)")
