"""Habana Gaudi (dl1.24xlarge) job specifics: the HCCL/EFA environment and the CPU binding of each rank.

Sources: Intel's DL1 post on EFA peer-direct (SynapseAI >= 1.8.0: RDMAV_FORK_SAFE=1 FI_EFA_USE_DEVICE_RDMA=1,
32 HPUs at 32 MB: all-reduce 12,110 -> 21,136 MB/s); Habana's HCCL docs, "Scale-out via Host NIC" (Host NIC
Gaudi Direct on AWS EFA needs both variables, libfabric >= 1.16.1 and Linux >= 5.12; setting HCCL_OVER_OFI
disables the auto-detection and forces the host-memory path, so it is never set here); Habana's
Model-References, whose 8-HPU runs bind ranks with `mpirun --bind-to core --map-by socket:PE=6` on 96 vCPUs.
"""

from __future__ import annotations

from toolkit.catalog import InstanceType
from toolkit.job.env import EnvVar

# The SynapseAI release that brought EFA peer-direct (Host NIC Gaudi Direct) to DL1.
PEER_DIRECT_SYNAPSEAI = "1.8.0"


def gaudi_env(instance: InstanceType, fabric: str) -> list[EnvVar]:
    """What a Gaudi job exports: lazy mode always; the two peer-direct variables when the queue uses EFA."""
    env = [EnvVar("PT_HPU_LAZY_MODE", "1", "Habana PyTorch bridge in lazy mode (our workloads call "
                                           "htcore.mark_step()); newer Gaudi software defaults to eager")]
    if fabric != "none":  # Queue.fabric: EFA enabled on the queue
        env += [
            EnvVar("RDMAV_FORK_SAFE", "1", f"SynapseAI >= {PEER_DIRECT_SYNAPSEAI}, EFA peer-direct: libibverbs keeps "
                                           "HPU memory registered with EFA safe when data-loader workers fork"),
            EnvVar("FI_EFA_USE_DEVICE_RDMA", "1", f"SynapseAI >= {PEER_DIRECT_SYNAPSEAI} (libfabric >= 1.16.1, "
                                                  "kernel >= 5.12): HCCL sends straight from HPU memory over EFA; "
                                                  "without it 32-HPU all-reduce at 32 MB drops 21,136 -> 12,110 MB/s"),
        ]
    return env


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
