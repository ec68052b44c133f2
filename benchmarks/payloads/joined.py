#!/usr/bin/python3
"""Every rank connects to rank 0 at MASTER_ADDR:MASTER_PORT; rank 0 writes the time all had joined.

The same payload for the hand-written sbatch script and for `hpc recipes submit` (benchmarks/bench_submit.py).
"""

import os
import socket
import sys
import time

rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
addr, port = socket.gethostbyname(os.environ["MASTER_ADDR"]), int(os.environ["MASTER_PORT"])
if rank == 0:
    with socket.create_server((addr, port)) as server:
        server.settimeout(120)
        for _ in range(world - 1):
            server.accept()[0].close()
    joined = time.time()
    with open(sys.argv[1] + ".tmp", "w") as out:
        out.write(f"{joined}\n")
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
else:
    deadline = time.monotonic() + 120
    while True:
        try:
            socket.create_connection((addr, port), timeout=5).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
