"""A user's script written for Hugging Face Accelerate: one all_reduce across every rank, then one JSON line per rank
(what the launcher gave it: its rank, the world, the backend's device, the sum); it ends as accelerate's examples do,
with end_training(), which destroys the process group (a gloo group left to the interpreter's exit can abort a rank:
"terminate called without an active exception", seen once under load)."""

import json
import os
import socket

import torch
from accelerate import Accelerator
from accelerate.utils import reduce

accelerator = Accelerator()
value = torch.tensor([float(accelerator.process_index + 1)], device=accelerator.device)
total = reduce(value, reduction="sum")
print(json.dumps({"event": "accelerate_allreduce", "rank": accelerator.process_index,
                  "world": accelerator.num_processes, "type": str(accelerator.distributed_type),
                  "sum": total.item(), "host": socket.gethostname(), "node": os.environ.get("GROUP_RANK")}),
      flush=True)
accelerator.wait_for_everyone()
accelerator.end_training()
