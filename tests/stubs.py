"""Run rendered sbatch scripts without Slurm: stub `srun`, `scontrol` and workload programs on PATH.

The stub srun behaves like the real one where a script can tell: it takes its options first (reading only
the step shape), then runs the command once per task with SLURM_PROCID / SLURM_LOCALID / SLURM_NODEID /
SLURM_NTASKS set. Workload stubs record their exact argv (NUL-separated) and environment per rank.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SRUN = r"""#!/bin/bash
nodes=1; tasks=1
while [[ $# -gt 0 && $1 == -* ]]; do
  case $1 in --nodes=*) nodes=${1#*=} ;; --ntasks-per-node=*) tasks=${1#*=} ;; esac
  shift
done
for ((i = 0; i < nodes * tasks; i++)); do
  SLURM_PROCID=$i SLURM_LOCALID=$((i % tasks)) SLURM_NODEID=$((i / tasks)) SLURM_NTASKS=$((nodes * tasks)) "$@" || exit
done
"""
SCONTROL = r"""#!/bin/bash
[[ $1 == show && $2 == hostnames ]] || exit 2
printf '%s\n' node-a node-b
"""
RECORD = r"""#!/bin/bash
printf '%s\0' "$@" > "$STUB_OUT/argv.$SLURM_PROCID"
env -0 > "$STUB_OUT/env.$SLURM_PROCID"
"""
FIRST_HOST = "node-a"
# A stand-in for the node's python3 where the batch shell runs the pre-flight (which tests/test_preflight*.py and
# tests/test_node_contract.py run for real): every node passes, so it opens the ranks' gate (toolkit.node.gate)
PASSING_PREFLIGHT = """#!/bin/sh
while [ $# -gt 0 ]; do [ "$1" = --gate ] && printf 'go\\n' > "$2"; shift; done
exit 0
"""
JOB_ID = 4242


def write_executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def install_stubs(directory: Path, programs: tuple[str, ...] = ("fairseq-train", "python")) -> Path:
    """A bin dir with srun, scontrol and recording stubs for `programs`; returns it."""
    bin_dir = directory / "bin"
    write_executable(bin_dir / "srun", SRUN)
    write_executable(bin_dir / "scontrol", SCONTROL)
    for name in programs:
        write_executable(bin_dir / name, RECORD)
    return bin_dir


def run_script(script: str, workdir: Path, bin_dir: Path, extra_env: dict[str, str] | None = None):
    """Execute a rendered script as a batch step would; returns (completed process, {rank: (argv, env)})."""
    out = workdir / "out"
    out.mkdir(exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    path = workdir / "job.sbatch"
    path.write_text(script)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(workdir), "STUB_OUT": str(out),
           "SLURM_JOB_ID": str(JOB_ID), "SLURM_JOB_NODELIST": "node-[a-b]", **(extra_env or {})}
    proc = subprocess.run(["bash", str(path)], cwd=workdir, env=env, capture_output=True, timeout=60)
    ranks = {}
    for argv_file in out.glob("argv.*"):
        rank = int(argv_file.suffix[1:])
        argv = [os.fsdecode(w) for w in argv_file.read_bytes().split(b"\0")[:-1]]
        entries = (out / f"env.{rank}").read_bytes().split(b"\0")[:-1]
        rank_env = dict(os.fsdecode(e).split("=", 1) for e in entries)
        ranks[rank] = (argv, rank_env)
    return proc, ranks
