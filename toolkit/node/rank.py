"""The values of the rank contract that node-side code shares with the planning side (toolkit.job.rank,
toolkit.workloads.stopping re-export them): the rendezvous port of a job's round, and a rank's exit status after
a requested stop."""

from __future__ import annotations

# MASTER_PORT = BASE + job id % SPAN: concurrent jobs on shared nodes get different ports, and the range stays
# below Linux's ephemeral ports (32768+), which outgoing connections may already hold.
MASTER_PORT_BASE = 15000
MASTER_PORT_SPAN = 16000

# A job with spares starts a fresh rendezvous after each restart (toolkit.node.spares), this many ids further: the
# old store's port may still be held, and jobs this far apart in id rarely share a first node.
RESTART_PORT_STRIDE = 1009

# sysexits EX_TEMPFAIL: "try again later". Checkpoint saved after a stop request; requeue the job to go on.
EXIT_STOPPED = 75


def master_port(job_id: int, restart: int = 0) -> int:
    """The rendezvous port of a job (the set-up block computes the same in shell), after `restart` restarts."""
    return MASTER_PORT_BASE + (job_id + restart * RESTART_PORT_STRIDE) % MASTER_PORT_SPAN
