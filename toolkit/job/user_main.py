"""The first code each rank of a researcher's own Python runs (launcher kinds python-script and python-module).

toolkit.job.spec passes this file's text to `python -c`, so a node needs only Python to run it (not this
toolkit), and both submission paths run it inside the same rank program (toolkit.job.rank):

    python -c CODE RENDEZVOUS_TIMEOUT_S (SCRIPT.py | -m MODULE) ARGS...

The contract for user scripts (what torchrun gives a script, in both launcher styles):
  - RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK (the node's index), MASTER_ADDR, MASTER_PORT
    are set: `dist.init_process_group(backend)` (env://, the default) joins the job. Style `script`: the rank
    program exports them from srun's task; style `torchrun`: torchrun sets them for its workers.
  - Style torchrun restarts all ranks of every node after a rank fails (up to max_restarts): a script that
    must not start over saves a checkpoint every N steps and, at start, resumes from its newest one
    (TORCHELASTIC_RESTART_COUNT counts this node's restarts only). Each round gets a fresh MASTER_PORT, the same
    on every node (torchrun runs with toolkit.job.spec.TORCHRUN_ENV).
  - init_process_group must return within RENDEZVOUS_TIMEOUT_S, else the rank exits 1 with a message saying
    so (a script that ignores the variables above waits for peers that never come).
  - SIGUSR2 before the time limit / on preemption: with `stops_on_signal: true` it reaches the ranks, which
    save and exit 75, and the job is requeued; otherwise it is ignored by the ranks, the job is requeued at
    once and the rerun resumes from the last periodic checkpoint.
  - A missing script or a module that cannot be found exits 1 with one line naming it, the node and Python.
  - A torchrun restart of a node's workers is one line in the job's log (`hpc: torchrun restart N of M on NODE`),
    which `hpc jobs status` and `--wait` report.
"""

import os
import sys


def fail(message):
    sys.stderr.write(f"hpc: error: rank {os.environ.get('RANK', '?')} on {os.uname().nodename}: {message}\n")
    sys.stderr.flush()
    os._exit(1)


def watch_rendezvous(timeout_s):
    """Make torch.distributed.init_process_group give up after timeout_s with a clear message."""
    import importlib.util
    import threading

    if importlib.util.find_spec("torch") is None:
        return
    import torch.distributed as dist

    if not dist.is_available():
        return
    original = dist.init_process_group

    def init_process_group(*args, **kwargs):
        done = threading.Event()

        def watchdog():
            if not done.wait(timeout_s):
                env = os.environ
                fail(f"init_process_group did not complete within {timeout_s:g} s (rendezvous "
                     f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}, world size {env.get('WORLD_SIZE')}): "
                     "the script must join with init_method='env://' (the default) or read RANK/WORLD_SIZE/"
                     "MASTER_ADDR/MASTER_PORT from the environment; raise launcher.rendezvous_timeout_s if "
                     "ranks start slowly")

        threading.Thread(target=watchdog, daemon=True).start()
        try:
            return original(*args, **kwargs)
        finally:
            done.set()

    dist.init_process_group = init_process_group
    dist.distributed_c10d.init_process_group = init_process_group


def announce_restart():
    """One line in the job's log when torchrun restarted this node's workers after one of them failed: torchrun
    logs that only at INFO, below its default WARNING (torch/distributed/elastic/agent/server/api.py, "will
    restart worker group"), so the job's log said nothing and the restart cost went unseen. The count is this
    node's agent's (it goes up where the worker failed); local rank 0 speaks for the node."""
    count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if count.isdigit() and int(count) > 0 and os.environ.get("LOCAL_RANK") == "0":
        node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename  # Slurm's name, where srun started it
        sys.stderr.write(f"hpc: torchrun restart {count} of {os.environ.get('TORCHELASTIC_MAX_RESTARTS', '?')} "
                         f"on {node}: this node's workers started again after one of them failed\n")
        sys.stderr.flush()


def main(argv):
    import runpy

    timeout_s, *target = argv
    if target[0] == "-m":
        import importlib.util

        module, args = target[1], target[2:]
        try:
            found = importlib.util.find_spec(module) is not None
            why = "it is not installed in this Python, nor on PYTHONPATH"
        except Exception as exc:  # a parent package that fails to import
            found, why = False, f"{type(exc).__name__}: {exc}"
        if not found:
            fail(f"module {module!r} cannot be imported by {sys.executable}: {why} (install it in the nodes' "
                 "environment, or set software.venv / --venv)")
    else:
        script, args = target[0], target[1:]
        if not os.path.isfile(script):
            fail(f"script {script} does not exist on this node (it must be on a shared file system)")
    announce_restart()
    watch_rendezvous(float(timeout_s))
    if target[0] == "-m":
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT.py` sets it
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":  # `python -c` runs it as __main__
    main(sys.argv[1:])
