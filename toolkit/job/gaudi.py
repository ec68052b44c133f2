"""Habana Gaudi (dl1.24xlarge) job specifics: the CPU binding of each rank (the HCCL/EFA environment is
toolkit.job.env.gaudi_env, beside the other stacks' variables).

Sources: Intel's DL1 post on EFA peer-direct (SynapseAI >= 1.8.0: RDMAV_FORK_SAFE=1 FI_EFA_USE_DEVICE_RDMA=1,
32 HPUs at 32 MB: all-reduce 12,110 -> 21,136 MB/s); Habana's HCCL docs, "Scale-out via Host NIC" (Host NIC
Gaudi Direct on AWS EFA needs both variables, libfabric >= 1.16.1 and Linux >= 5.12; setting HCCL_OVER_OFI
disables the auto-detection and forces the host-memory path, so it is never set here); Habana's
Model-References, whose 8-HPU runs bind ranks with `mpirun --bind-to core --map-by socket:PE=6` on 96 vCPUs.
"""

from __future__ import annotations

from toolkit.catalog import InstanceType


def core_masks(cores: int, threads_per_core: int, ranks: int) -> tuple[str, ...]:
    """Per local rank, the hex CPU mask of its own `cores // ranks` consecutive cores and their SMT siblings.

    Assumes Linux's usual numbering on two-socket Xeons (not yet seen on a dl1): CPUs 0..cores-1 are the first
    thread of every core, socket 0's cores first, and CPU c + cores is core c's sibling; with SMT off only
    0..cores-1 exist. Consecutive cores per rank then fill socket 0 first. Masks name machine CPUs (Slurm's
    mc_support.html, low-level binding with --cpu-bind=mask_cpu).
    """
    per_rank = cores // ranks
    masks = []
    for rank in range(ranks):
        block = ((1 << per_rank) - 1) << (rank * per_rank)
        masks.append(hex(sum(block << (thread * cores) for thread in range(threads_per_core))))
    return tuple(masks)


def srun_binding(instance: InstanceType, tasks_per_node: int, smt_off: bool,
                 holds_node: bool) -> tuple[tuple[str, ...], str]:
    """srun options that pin each HPU rank to its own cores, and why.

    Habana's `--map-by socket:PE=N --bind-to core` gives each rank N whole cores, ranks filling one socket
    before the next (N = 6 on DL1: 48 cores / 8 HPUs). Slurm cannot be asked for that on ParallelCluster's
    nodes: they are declared `CPUs=N` only (aws-parallelcluster-cookbook cookbooks/aws-parallelcluster-slurm/
    files/default/head_node_slurm/slurm/templates/common/slurm_parallelcluster_utils.conf), which Slurm reads
    as N one-core sockets, so `--cpu-bind=cores` and `--distribution=block:block` do not know real cores or
    sockets. The masks name the machine's CPUs themselves (srun --cpu-bind=mask_cpu, honoured by task/affinity).
    They lie inside the job's CPUs only when its ranks hold every CPU of the node; otherwise Slurm's own
    per-rank binding is kept.
    """
    cores = instance.cores // tasks_per_node
    if tasks_per_node == 1:
        return ("--cpu-bind=none",), "one Slurm task per node (torchrun) starts the node's ranks: nothing to pin"
    if not holds_node:
        return (("--cpu-bind=cores",),
                "the ranks hold only part of each node's CPUs: Slurm binds each to the CPUs it allocated")
    threads = 1 if smt_off else instance.threads_per_core
    masks = core_masks(instance.cores, threads, tasks_per_node)
    return ((f"--cpu-bind=mask_cpu:{','.join(masks)}",),
            f"Habana's mpirun --bind-to core --map-by socket:PE={cores}: {cores} cores ({cores * threads} CPUs) "
            f"per HPU rank, socket 0's cores first, named by machine CPU id (nodes declared CPUs=N give Slurm "
            f"no sockets or cores to bind by)")
