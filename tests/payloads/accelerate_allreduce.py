"""A user's script written for Hugging Face Accelerate: one all_reduce across every rank, then one JSON line per rank
(what the launcher gave it: its rank, the world, the backend's device, the sum); it ends as accelerate's examples do,
with end_training(), which destroys the process group (a gloo group left to the interpreter's exit can abort a rank:
"terminate called without an active exception", seen once under load)."""

import json
import os
import socket
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import reduce

accelerator = Accelerator()
value = torch.tensor([float(accelerator.process_index + 1)], device=accelerator.device)
total = reduce(value, reduction="sum")
# One write per line: the node's two ranks share its launch's stdout, and with PYTHONUNBUFFERED print() writes the
# text and the newline apart, so the two lines can interleave (seen once under load: both of a node's lines lost).
sys.stdout.write(json.dumps({"event": "accelerate_allreduce", "rank": accelerator.process_index,
                             "world": accelerator.num_processes, "type": str(accelerator.distributed_type),
                             "sum": total.item(), "host": socket.gethostname(),
                             "node": os.environ.get("GROUP_RANK")}) + "\n")
sys.stdout.flush()
accelerator.wait_for_everyone()
accelerator.end_training()
