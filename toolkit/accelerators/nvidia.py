"""NVIDIA GPUs (p3/p4/p5/p6, g4dn/g5/g6): Slurm GRES, unbound ranks, NCCL over aws-ofi-nccl, DCGM health checks."""

from __future__ import annotations

from typing import Mapping

from toolkit.accelerators.base import LIBFABRIC_DIR, OPENMPI_DIR, AmiTrap, EnvVar, Family, Note
from toolkit.catalog import InstanceType

# aws-ofi-nccl's directory as the EFA installer lays it out; older AMIs had it in /opt/aws-ofi-nccl/lib
# (aws-samples/awsome-distributed-training micro-benchmarks/nccl-tests/slurm/nccl-tests-ami.sbatch, and the same
# file at commit 9b037bddcac7085c95ed3d2ca069206995aa8df6). A directory a node lacks costs nothing.
OFI_NCCL_DIRS = ("/opt/amazon/ofi-nccl/lib", "/opt/aws-ofi-nccl/lib")
PYTHON_NCCL = "--torch-nccl"  # toolkit.node.loader_check: torch's own libnccl
NET_PLUGIN = "nccl-net-plugin"  # toolkit.node.loader_check: the plugin NCCL_NET names

V100_TRAP = (
    "{itype} has V100 GPUs, which NVIDIA's open (OpenRM) kernel driver does not support, and ParallelCluster "
    ">= 3.9 official AMIs ship only that driver: nodes would boot without a working GPU"
)
V100_FIX = (
    "use an AMI with NVIDIA's proprietary driver (Image/CustomAmi or the queue's Image/CustomAmi), e.g. built by "
    "`pcluster build-image` with the open kernel module turned off or with a Deep Learning AMI as parent; "
    "an AMI made by build-image then needs `pcluster create-cluster --suppress-validators "
    "type:InstanceTypeBaseAMICompatibleValidator`"
)
V100_REMINDER = (
    "V100 trap: {itype} needs NVIDIA's proprietary driver (the open OpenRM driver of ParallelCluster >= 3.9 "
    "official AMIs has no V100 support). Make sure the custom AMI carries it; an AMI made by `pcluster "
    "build-image` needs `--suppress-validators type:InstanceTypeBaseAMICompatibleValidator` at create time."
)


def communication_env(instance: InstanceType, fabric: str) -> list[EnvVar]:
    """NCCL/EFA variables for a GPU instance type and the queue's fabric (Queue.fabric)."""
    env = [EnvVar("NCCL_DEBUG", "INFO", "bring-up: NCCL logs its version and the transport it picked "
                                        "(NET/OFI = EFA, NET/Socket = TCP); set WARN in the recipe's env once healthy"),
           EnvVar("NCCL_DEBUG_SUBSYS", "INIT,NET", "only NCCL's start-up and network lines: what `hpc jobs status` "
                                                   "and `hpc report run` read to tell which transport ran")]
    if fabric != "none":
        env.append(EnvVar("NCCL_NET", "AWS Libfabric", "fail closed: NCCL must use the aws-ofi-nccl plugin (EFA); a "
                                                       "missing plugin stops the job ('network AWS Libfabric not "
                                                       "found') instead of falling back to TCP sockets at a fraction "
                                                       "of the speed. Every plugin release answers to this name"))
    if fabric == "legacy":
        env += [
            EnvVar("FI_PROVIDER", "efa", "aws-ofi-nccl <= 1.5 does not pick the EFA libfabric provider itself"),
            EnvVar("FI_EFA_TX_MIN_CREDITS", "64", "older libfabric EFA provider: more send credits, as in the "
                                                  "P3dn RoBERTa runs"),
            EnvVar("NCCL_SOCKET_IFNAME", "^lo,docker", "bootstrap on the instance's network interface (eth0 or "
                                                       "ens5 by AMI), never loopback or docker"),
            EnvVar("NCCL_PROTO", "simple", "aws-ofi-nccl <= 1.5 over EFA: its maintainers require the Simple protocol "
                                           "(LL/LL128 can corrupt data there); newer plugins must not get it, it "
                                           "bypasses their tuner"),
        ]
        if instance.gpudirect_rdma:
            env.append(EnvVar("FI_EFA_USE_DEVICE_RDMA", "1", f"{instance.name} has GPUDirect RDMA over EFA; old "
                                                             "libfabric leaves it off unless asked"))
    elif fabric == "none":
        env += [
            EnvVar("NCCL_SOCKET_NTHREADS", "4", "TCP only: more socket threads per connection (threads x sockets "
                                                "<= 64); 4x4 doubled bus bandwidth above ~1 MB on 25 Gb/s"),
            EnvVar("NCCL_NSOCKS_PERTHREAD", "4", "TCP only: sockets per thread (see NCCL_SOCKET_NTHREADS)"),
        ]
    # modern: aws-ofi-nccl >= 1.7 / libfabric >= 1.18 set the provider, RDMA and protocol defaults themselves;
    # setting the old knobs by hand overrides tuned, version-gated values.
    return env


class Nvidia(Family):
    kind = "nvidia"
    device = "gpu"
    label = "NVIDIA GPU"
    units = "GPUs"
    has = "GPUs"
    slurm_gres = True  # ParallelCluster declares Gres=gpu:N on NVIDIA nodes
    torch_device, torch_device_why = "cuda", "one GPU per rank (LOCAL_RANK)"
    collective, collective_why = "nccl", "NCCL between GPUs"
    kubernetes_resource = "nvidia.com/gpu"  # NVIDIA's k8s-device-plugin
    ec2_manufacturer = "NVIDIA"
    prolog_health_check = True  # ParallelCluster's GPU check is NVIDIA DCGM's

    def srun_binding(self, instance: InstanceType, tasks_per_node: int, smt_off: bool,
                     holds_node: bool) -> tuple[tuple[str, ...], tuple[Note, ...]]:
        # ParallelCluster's slurm.conf binds (TaskPlugin=task/affinity,task/cgroup) on nodes declared CPUs=N
        # (aws-parallelcluster-cookbook cookbooks/aws-parallelcluster-slurm/templates/default/slurm/slurm.conf.erb):
        # Slurm's automatic binding then hands each rank CPUs blind to its GPU's socket. Unbound, NCCL pins its
        # threads near each rank's GPU itself; as AWS runs nccl-tests on ParallelCluster (aws-samples/
        # awsome-distributed-training micro-benchmarks/nccl-tests/slurm/nccl-tests-container.sbatch) and as
        # aws-ofi-nccl advises.
        return ("--cpu-bind=none",), (Note("srun cpu binding", "--cpu-bind=none", "nodes declared CPUs=N give Slurm "
                                           "no GPU locality: GPU ranks stay unbound and NCCL pins its threads near "
                                           "each GPU"),)

    def job_env(self, instance: InstanceType, fabric: str) -> list[EnvVar]:
        return communication_env(instance, fabric)

    def library_dirs(self, instance: InstanceType, fabric: str) -> tuple[tuple[str, ...], str | None]:
        if fabric == "none":
            return (), None
        return ((LIBFABRIC_DIR, OPENMPI_DIR, *OFI_NCCL_DIRS),
                "the EFA installer's libfabric, Open MPI and aws-ofi-nccl (/opt/aws-ofi-nccl on older AMIs), "
                "as AWS's nccl-tests jobs set it: NCCL_NET fails closed when the plugin is not found")

    def loader_checks(self, *, fabric: str, python_ranks: bool, gpus_per_node: int,
                      environ: Mapping[str, str]) -> list[str]:
        args = [PYTHON_NCCL] if gpus_per_node and python_ranks else []
        if gpus_per_node and "NCCL_NET" in environ:  # NCCL_NET names a plugin's network: without it NCCL stops
            args.append(f"--{NET_PLUGIN}")
        return args

    def loader_fix(self, library: str, *, binary: bool) -> str | None:
        if library == NET_PLUGIN:
            return (f"install aws-ofi-nccl on the nodes (the EFA installer puts it in {OFI_NCCL_DIRS[0]}, older AMIs "
                    f"{OFI_NCCL_DIRS[1]}: both are on EFA jobs' path), or add the directory of its libnccl-net*.so to "
                    "the recipe's software.library_path; with NCCL_NET='AWS Libfabric' the job stops without it. A "
                    "dependency error above (libfabric) means its directory is missing from the path")
        if library.startswith("libnccl"):
            if binary:
                return ("set the recipe's software.nccl_home to the NCCL the program was built against "
                        "(`make NCCL_HOME=...`; its lib/ holds libnccl.so.2)")
            return "install PyTorch with CUDA (it brings its NCCL, nvidia-nccl) in the job's environment (software:)"
        return None

    def official_ami_trap(self, instance: InstanceType) -> AmiTrap | None:
        if not instance.proprietary_driver:
            return None
        return AmiTrap(V100_TRAP.format(itype=instance.name), V100_FIX, V100_REMINDER.format(itype=instance.name))

    def custom_ami_note(self) -> str:
        return " with NVIDIA's proprietary driver"


NVIDIA = Nvidia()
