#!/usr/bin/python3
"""A workload that records what its rank received: argv and environment, one JSON file per rank.

Debian's python3 runs it: a pyenv shim would edit PATH on the way.

Used to compare the rendered sbatch path with the submitit path rank by rank. Writes to $PROBE_OUT (the
recipe's env) as rank-<SLURM_PROCID>.json (in a job array: task-<ARRAY JOB ID>_<TASK ID>-rank-<SLURM_PROCID>.json:
a sweep's several arrays each number their tasks from 0);
the rank named by $PROBE_SLOW_RANK waits 3 s before it writes;
the rank named by $PROBE_FAIL_RANK exits 3, and so does every rank whose argv holds the word $PROBE_FAIL_ARG.
"""

import json
import os
import sys
import time
from pathlib import Path

rank = os.environ.get("SLURM_PROCID", "?")
out = Path(os.environ["PROBE_OUT"])
out.mkdir(parents=True, exist_ok=True)
task = os.environ.get("SLURM_ARRAY_TASK_ID")
name = f"task-{os.environ.get('SLURM_ARRAY_JOB_ID')}_{task}-rank-{rank}.json" if task else f"rank-{rank}.json"
if os.environ.get("PROBE_SLOW_RANK") == rank:
    time.sleep(3)  # the job ends after this rank, not after rank 0
(out / name).write_text(json.dumps({"argv": sys.argv[1:], "env": dict(os.environ)}))
print(f"probe rank {rank} on {os.uname().nodename}: {len(sys.argv) - 1} args")
if os.environ.get("PROBE_FAIL_RANK") == rank or os.environ.get("PROBE_FAIL_ARG", "\0") in sys.argv:
    print(f"probe rank {rank}: failing on purpose", file=sys.stderr)
    sys.exit(3)
