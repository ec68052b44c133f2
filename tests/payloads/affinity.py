#!/usr/bin/python3
"""A workload that records where its rank may run: the node and /proc/self/status's Cpus_allowed_list (the CPU
binding srun gave it), one JSON file per rank in $AFFINITY_OUT."""

import json
import os
from pathlib import Path

allowed = next(line.split(":", 1)[1].strip() for line in Path("/proc/self/status").read_text().splitlines()
               if line.startswith("Cpus_allowed_list:"))
out = Path(os.environ["AFFINITY_OUT"])
out.mkdir(parents=True, exist_ok=True)
(out / f"rank-{os.environ['SLURM_PROCID']}.json").write_text(
    json.dumps({"node": os.environ["SLURMD_NODENAME"], "cpus": allowed}))
