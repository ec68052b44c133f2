#!/usr/bin/python3
"""A rank that records its pid ($SLEEPER_OUT/pid-<job>-<rank>) and sleeps $SLEEPER_SECONDS: tests read its
/proc/<pid>/environ while it runs."""

import os
import time
from pathlib import Path

out = Path(os.environ["SLEEPER_OUT"])
out.mkdir(parents=True, exist_ok=True)
job = os.environ.get("SLURM_JOB_ID", "local")
(out / f"pid-{job}-{os.environ.get('SLURM_PROCID', '0')}").write_text(str(os.getpid()))
time.sleep(float(os.environ.get("SLEEPER_SECONDS", "5")))
