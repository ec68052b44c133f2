"""One Slurm task per rank: ranks 1..N-1 connect to rank 0 at MASTER_ADDR:PORT and tell it who they are.

MASTER_ADDR is the job's first node (`scontrol show hostnames`), as launchers derive it; rank 0 prints one
JSON line with what it heard, proving cross-node rendezvous through the nodes' own names.
"""

import json
import os
import socket
import subprocess
import time

rank = int(os.environ["SLURM_PROCID"])
world = int(os.environ["SLURM_NTASKS"])
master = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                        capture_output=True, text=True, check=True, timeout=20).stdout.split()[0]
port = 20000 + int(os.environ["SLURM_JOB_ID"]) % 20000  # concurrent jobs share one network
me = {"rank": rank, "host": socket.gethostname(), "localid": int(os.environ["SLURM_LOCALID"]),
      "nodeid": int(os.environ["SLURM_NODEID"])}

if rank == 0:
    address = socket.gethostbyname(master)
    with socket.create_server((address, port)) as server:
        server.settimeout(60)
        peers = []
        while len(peers) < world - 1:
            conn, _ = server.accept()
            with conn, conn.makefile() as f:
                peers.append(json.loads(f.readline()))
    print(json.dumps({"job_id": os.environ["SLURM_JOB_ID"], "master": master, "master_addr": address,
                      "self": me, "peers": sorted(peers, key=lambda p: p["rank"])}), flush=True)
else:
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection((master, port), timeout=5) as conn:
                conn.sendall((json.dumps(me) + "\n").encode())
            break
        except OSError:  # rank 0 is not listening yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
