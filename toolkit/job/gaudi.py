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

def srun_binding(instance: InstanceType, tasks_per_node: int) -> tuple[tuple[str, ...], str]:
    """srun options that pin each rank to its own cores, and why.

    Habana's `--map-by socket:PE=N --bind-to core` gives each rank N whole cores, ranks filling one socket
    before the next (N = 6 on DL1: 48 cores / 8 HPUs). The Slurm form: --cpus-per-task (N cores x 2
    threads, the queue's vCPUs / ranks), --cpu-bind=cores, and block:block so ranks 0-3 share socket 0.
    """
    cores = instance.cores // tasks_per_node
    return (("--distribution=block:block", "--cpu-bind=cores"),
            f"Habana's mpirun --bind-to core --map-by socket:PE={cores}: {cores} cores "
            f"({cores * instance.threads_per_core} vCPUs) per HPU rank, sockets filled in order")
