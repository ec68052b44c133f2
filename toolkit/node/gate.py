"""The pre-flight gate: the ranks' step starts beside the pre-flight, and every rank waits here until the pre-flight
has passed on every node of the job; only then does its workload start.

Why: the pre-flight is one srun step, and the ranks' is another; one after the other, the job paid for starting
two steps (and submitit's per-rank Python) before its first rank ran. Side by side, the ranks' step starts while
the nodes are checked, and the ranks wait in a shell loop: it touches no device, and its memory (a bash per rank,
and under submitit its Python) is far inside the free-memory check's margin.
The verdict stays the pre-flight's, for the whole job (toolkit.node.preflight): no rank's workload starts on a
node that passed while another node fails.

The gate is a file in the run dir, on the shared file system every node reads (the batch shell makes it empty
before either step starts; toolkit.slurm.render.gate_lines). The pre-flight rewrites it in place with GO once
its records are written; never by rename, so NFS's close-to-open consistency shows the new content at a rank's
next open (RFC 7530 section 10.3.1; Lustre is coherent anyway). A failed pre-flight writes nothing: it requeues
the job, which ends every step, or the batch shell ends the job's processes (kill -TERM to its process group,
which slurmstepd made the batch script lead: SchedMD/slurm src/slurmd/slurmstepd/mgr.c) and exits 1. A rank that
sees no verdict in WAIT_S gives up, so a job whose batch shell is gone cannot hold its nodes.

Standard library only (the node-side contract, toolkit.node): the planning side renders the rank's wait from here,
and the pre-flight's bundle writes the verdict.
"""

from __future__ import annotations

import os

VAR = "HPC_PREFLIGHT_GATE"  # the gate file's path, exported by the batch shell to both steps
GO = "go"
WAIT_S = 600  # longer than the pre-flight's step (STEP_TIMEOUT_S) and its requeue's sbatch and scontrol calls
POLL_S = 0.02  # a rank's re-read of the gate: what its start waits at most beyond the verdict


def wait_script() -> str:
    """The bash a rank runs first: wait for GO in $HPC_PREFLIGHT_GATE (where set), or give up after WAIT_S.
    No process per poll: the gate is read by bash's own `read` (its 2> before its < so that a failed open is
    silent), and the pause between reads is a `read -t` on a pipe this shell holds open at both ends, which no
    one writes (`exec {fd}<> <(:)`: bash >= 4.1), rather than a `sleep` process every POLL_S on every rank. An
    unreadable gate (this node has lost the shared file system) is waited on too: the pre-flight names the node
    and requeues or stops the job, which ends this step."""
    give_up = (f'echo "hpc: rank ${{SLURM_PROCID:-?}} on ${{SLURMD_NODENAME:-$HOSTNAME}}: no pre-flight verdict in '
               f'{WAIT_S} s (${VAR}): not starting" >&2; exit 1')
    # where the pipe cannot be made (no /dev/fd), a `sleep` per poll: never a loop without a pause
    return (f'if [ -n "${{{VAR}:-}}" ]; then hpc_gate=; exec {{hpc_nap}}<> <(:) || hpc_nap=; while :; do '
            f'read -r hpc_gate 2>/dev/null < "${VAR}"; [ "$hpc_gate" = {GO} ] && break; '
            f'[ "$SECONDS" -lt {WAIT_S} ] || {{ {give_up}; }}; '
            f'if [ -n "$hpc_nap" ]; then read -r -t {POLL_S} -u "$hpc_nap" || :; else sleep {POLL_S}; fi; '
            f'done; [ -z "$hpc_nap" ] || exec {{hpc_nap}}<&-; unset hpc_gate hpc_nap; fi')


def open_gate(path: str) -> None:
    """Write GO into the gate, in place (the ranks' next read sees it)."""
    with open(path, "w") as gate:
        gate.write(GO + "\n")
        gate.flush()
        os.fsync(gate.fileno())
