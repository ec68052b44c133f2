"""Ranks ordered by network node: where the job's queue has a topology file (tag hpc:topology,
toolkit.cluster.topology), the rendered script writes a hostfile listing the job's nodes in the file's network
order (each node once per task, nodes the file lacks last) and starts the ranks' srun with it
(`SLURM_HOSTFILE=FILE srun --distribution=arbitrary --ntasks=N`, srun(1)), so that rank neighbours, which a ring
all-reduce passes data between, sit under one network node.

Measured on Slurm 22.05 here: an exported SLURM_HOSTFILE makes every later srun of the batch shell lay its tasks
out by the file, even without --distribution=arbitrary (the pre-flight's one task per node included), and
--ntasks-per-node is ignored with arbitrary (it would start one task per node): so the variable is set on the
ranks' srun line alone and the task count is given. MASTER_ADDR follows the first line: rank 0's node hosts the
rendezvous.
"""

from __future__ import annotations

import shlex

from toolkit.job.spec import JobSpec

DISTRIBUTION = "--distribution=arbitrary"


def ordered(spec: JobSpec) -> bool:
    return bool(spec.slurm and spec.slurm.network_order)


def hostfile_path(spec: JobSpec) -> str:
    return f"{spec.run_dir}/.hpc/hostfile-$SLURM_JOB_ID"


def hostfile_lines(spec: JobSpec) -> list[str]:
    """Batch-shell lines writing the hostfile (after the rendezvous lines: NODES, MASTER_ADDR); none unless the
    job is ordered."""
    if not spec.slurm or not spec.slurm.network_order:
        return []
    part = spec.slurm
    order = " ".join(shlex.quote(node) for node in part.network_order)
    tasks = part.tasks_per_node
    return [
        f"HPC_NETWORK_ORDER=({order})",
        f'HPC_HOSTFILE={shlex.quote(spec.run_dir + "/.hpc")}/hostfile-"$SLURM_JOB_ID"',
        f'mkdir -p {shlex.quote(spec.run_dir + "/.hpc")} && : > "$HPC_HOSTFILE"',
        '# the job\'s nodes in network order, then any the topology file lacks; each once per task',
        'for node in "${HPC_NETWORK_ORDER[@]}" $NODES; do',
        '  case $\'\\n\'"$NODES"$\'\\n\' in *$\'\\n\'"$node"$\'\\n\'*) ;; *) continue ;; esac',
        '  grep -qxF -- "$node" "$HPC_HOSTFILE" && continue',
        f'  for ((task = 0; task < {tasks}; task++)); do echo "$node"; done >> "$HPC_HOSTFILE"',
        'done',
        'read -r MASTER_ADDR < "$HPC_HOSTFILE"  # rank 0\'s node hosts the rendezvous',
        'export MASTER_ADDR',
        f'echo {shlex.quote(f"hpc: ranks ordered by network node from {part.topology_file}:")} '
        '"$(uniq "$HPC_HOSTFILE" | paste -sd " ")"',
    ]


def ordered_srun(spec: JobSpec, srun_words: list[str]) -> str:
    """The ranks' srun line: as given, or with the hostfile (SLURM_HOSTFILE on this line only), the arbitrary
    distribution and the job's task count in place of --ntasks-per-node."""
    if not ordered(spec):
        return shlex.join(srun_words)
    part = spec.slurm
    assert part is not None
    total = f"--ntasks={spec.nodes * part.tasks_per_node}"
    words = [w for w in srun_words if not w.startswith(("--ntasks-per-node=", "--ntasks="))]
    words[1:1] = [DISTRIBUTION, total] if words[0] == "srun" else []
    return f'SLURM_HOSTFILE="$HPC_HOSTFILE" {shlex.join(words)}'
