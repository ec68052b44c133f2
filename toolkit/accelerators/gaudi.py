"""Habana Gaudi (dl1.24xlarge): HPUs that are no Slurm GRES, one rank per HPU pinned to its own cores, HCCL over
EFA through the HCCL OFI wrapper, a custom AMI.

Sources: Intel's DL1 post on EFA peer-direct (SynapseAI >= 1.8.0: RDMAV_FORK_SAFE=1 FI_EFA_USE_DEVICE_RDMA=1,
32 HPUs at 32 MB: all-reduce 12,110 -> 21,136 MB/s); Habana's HCCL docs, "Scale-out via Host NIC" (Host NIC
Gaudi Direct on AWS EFA needs both variables, libfabric >= 1.16.1 and Linux >= 5.12; setting HCCL_OVER_OFI
disables the auto-detection and forces the host-memory path, so it is never set here); Habana's
Model-References, whose 8-HPU runs bind ranks with `mpirun --bind-to core --map-by socket:PE=6` on 96 vCPUs.
"""

from __future__ import annotations

from typing import Mapping

from toolkit.accelerators.base import (LIBFABRIC_DIR, OPENMPI_DIR, AmiTrap, CollectiveReference, EnvVar, Family,
                                       Note)
from toolkit.catalog import InstanceType

# HCCL finds its libfabric wrapper (libhccl_ofi_wrapper.so) through the loader: HabanaAI/hccl_ofi_wrapper README.md
# installs it in /usr/lib/habanalabs and puts that on LD_LIBRARY_PATH; HabanaAI/Model-References 1.8.0
# PyTorch/nlp/pretraining/deepspeed-bert/README.md (DL1 multi-server) has it where it was built, /root/hccl_ofi_wrapper,
# then /opt/amazon/openmpi/lib and /opt/amazon/efa/lib.
HCCL_OFI_WRAPPER = "libhccl_ofi_wrapper.so"  # HabanaAI/hccl_ofi_wrapper README.md: the library HCCL loads
HCCL_OFI_WRAPPER_DIRS = ("/usr/lib/habanalabs", "/root/hccl_ofi_wrapper")
# The SynapseAI release that brought EFA peer-direct (Host NIC Gaudi Direct) to DL1.
PEER_DIRECT_SYNAPSEAI = "1.8.0"

# Intel's DL1 EFA peer-direct post: 32 HPUs (4 nodes) at 32 MB messages, without and with peer-direct (MB/s), as the
# bus bandwidth column of nccl-tests-format tables (Habana's hccl_demo calls it NW bandwidth: algbw x 2(n-1)/n for
# all-reduce, x (n-1)/n for the others), GB/s x 1000 = MB/s. Peer-direct is the expected state (gaudi_env sets it
# up on queues with EFA).
PEER_DIRECT_MBS = {"all_reduce": (12110, 21136), "all_gather": (20299, 41082), "reduce_scatter": (9249, 17418)}
DL1_PEER_DIRECT = CollectiveReference(
    source=f"Intel's DL1 EFA peer-direct post: 32 HPUs (4 x dl1.24xlarge), 32 MB messages, SynapseAI "
           f"{PEER_DIRECT_SYNAPSEAI}",
    called="the post", ranks=32, devices="HPUs", nodes=4, size_bytes=32 * 2**20, figures_mbs=PEER_DIRECT_MBS,
    expected="peer-direct",
    failure_means="HCCL is staging through host memory",
    fix=(f"enable EFA peer-direct: RDMAV_FORK_SAFE=1 and FI_EFA_USE_DEVICE_RDMA=1 on SynapseAI >= "
         f"{PEER_DIRECT_SYNAPSEAI} (libfabric >= 1.16.1, Linux >= 5.12), EFA enabled on the queue, and HCCL_OVER_OFI "
         "unset (it forces the host-memory path); `hpc recipes render` sets the variables for dl1 queues with EFA"))

GAUDI_TRAP = (
    "{itype} has Habana Gaudi accelerators, which ParallelCluster's official AMIs do not support (no Habana "
    "driver or SynapseAI): nodes would boot without working accelerators"
)
GAUDI_FIX = (
    "use an AMI with the Habana driver and SynapseAI (Image/CustomAmi or the queue's Image/CustomAmi), e.g. built "
    "by `pcluster build-image` with a Habana Deep Learning AMI as parent"
)


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


def gaudi_env(instance: InstanceType, fabric: str) -> list[EnvVar]:
    """What a Gaudi job exports: lazy mode always; the two peer-direct variables and HCCL's bootstrap interface
    when the queue uses EFA (sources: this module's docstring; the loader path is library_dirs())."""
    env = [EnvVar("PT_HPU_LAZY_MODE", "1", "Habana PyTorch bridge in lazy mode (our workloads call "
                                           "htcore.mark_step()); newer Gaudi software defaults to eager")]
    if fabric != "none":  # Queue.fabric: EFA enabled on the queue
        env += [
            EnvVar("RDMAV_FORK_SAFE", "1", f"SynapseAI >= {PEER_DIRECT_SYNAPSEAI}, EFA peer-direct: libibverbs keeps "
                                           "HPU memory registered with EFA safe when data-loader workers fork"),
            EnvVar("FI_EFA_USE_DEVICE_RDMA", "1", f"SynapseAI >= {PEER_DIRECT_SYNAPSEAI} (libfabric >= 1.16.1, "
                                                  "kernel >= 5.12): HCCL sends straight from HPU memory over EFA; "
                                                  "without it 32-HPU all-reduce at 32 MB drops 21,136 -> 12,110 MB/s"),
            EnvVar("HCCL_SOCKET_IFNAME", "eth0", "HCCL's bootstrap sockets on the instance's primary interface, as "
                                                 "Model-References' DL1 set-up gives it (deepspeed-bert README); set "
                                                 "env.HCCL_SOCKET_IFNAME in the recipe where the AMI names it ens5"),
        ]
    return env


class Gaudi(Family):
    kind = "gaudi"
    device = "hpu"
    label = "Gaudi HPU"
    units = "HPUs"
    has = "Gaudi HPUs"
    slurm_gres = False  # ParallelCluster declares no GRES for HPUs: one rank per HPU via --ntasks-per-node
    torch_device, torch_device_why = "hpu", "one HPU per rank (the Habana bridge takes module id = LOCAL_RANK)"
    collective, collective_why = "hccl", "HCCL between HPUs (scale-out over EFA)"
    kubernetes_resource = "habana.ai/gaudi"  # Habana's k8s device plugin
    kubernetes_form = False  # no Gaudi pod form yet (images, the device plugin's set-up)
    ec2_manufacturer = "Habana"
    collective_reference = DL1_PEER_DIRECT
    workload_runtime = "toolkit.workloads.hpu"  # the Habana PyTorch bridge, in lazy mode

    def srun_binding(self, instance: InstanceType, tasks_per_node: int, smt_off: bool,
                     holds_node: bool) -> tuple[tuple[str, ...], tuple[Note, ...]]:
        binding, why = srun_binding(instance, tasks_per_node, smt_off, holds_node)
        return binding, (Note("srun cpu binding", " ".join(binding), why),
                         Note("--gpus-per-node", "not set", "HPUs are no Slurm GPUs (ParallelCluster declares no "
                                                            "GRES for them): one rank per HPU via --ntasks-per-node"))

    def job_env(self, instance: InstanceType, fabric: str) -> list[EnvVar]:
        return gaudi_env(instance, fabric)  # HCCL, not NCCL: no NCCL_* variables

    def library_dirs(self, instance: InstanceType, fabric: str) -> tuple[tuple[str, ...], str | None]:
        if fabric == "none":
            return (), None
        return ((*HCCL_OFI_WRAPPER_DIRS, OPENMPI_DIR, LIBFABRIC_DIR),
                "the HCCL OFI wrapper HCCL loads for EFA scale-out, Open MPI and libfabric, as Habana's DL1 "
                "set-up gives them")

    def loader_checks(self, *, fabric: str, python_ranks: bool, gpus_per_node: int,
                      environ: Mapping[str, str]) -> list[str]:
        return ["--library", HCCL_OFI_WRAPPER] if fabric != "none" else []  # HCCL scale-out over EFA

    def loader_fix(self, library: str, *, binary: bool) -> str | None:
        if library != HCCL_OFI_WRAPPER:
            return None
        return (f"build HabanaAI/hccl_ofi_wrapper against libfabric ({LIBFABRIC_DIR}) and install it in "
                f"{HCCL_OFI_WRAPPER_DIRS[0]}, or add its directory to the recipe's software.library_path")

    def official_ami_trap(self, instance: InstanceType) -> AmiTrap:
        return AmiTrap(GAUDI_TRAP.format(itype=instance.name), GAUDI_FIX)

    def custom_ami_note(self) -> str:
        return (", made by `pcluster build-image` with a Habana Deep Learning AMI as ParentImage (ParallelCluster "
                "does not boot the DLAMI itself)")


GAUDI = Gaudi()
