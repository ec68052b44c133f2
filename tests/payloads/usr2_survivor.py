"""A user script that knows nothing of SIGUSR2: writes its pid to DIR/rank-R.pid, sleeps, prints "done R"."""

import os
import sys
import time

os.makedirs(sys.argv[1], exist_ok=True)
with open(os.path.join(sys.argv[1], f"rank-{os.environ['RANK']}.pid"), "w") as handle:
    handle.write(str(os.getpid()))
time.sleep(float(sys.argv[2]))
print(f"done {os.environ['RANK']}", flush=True)
