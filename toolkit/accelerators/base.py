"""What every accelerator family answers (toolkit.accelerators): the questions planning, Slurm, Kubernetes, the
cluster config and the health checks ask of a node's devices. The catalog (toolkit/catalog.yaml) holds the facts of
each instance type (how many devices, EFA, floors); a family holds the behaviour those facts call for."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal, Mapping, NamedTuple

from toolkit.catalog import InstanceType

Device = Literal["gpu", "hpu", "cpu"]  # a job's device form, as recipes' resources.runs_on names it

# Library directories the EFA installer creates, shared by the families that scale out over EFA
# (aws-samples/awsome-distributed-training micro-benchmarks/nccl-tests/slurm/nccl-tests-ami.sbatch).
LIBFABRIC_DIR = "/opt/amazon/efa/lib"
OPENMPI_DIR = "/opt/amazon/openmpi/lib"


@dataclasses.dataclass(frozen=True)
class EnvVar:
    """One variable a job exports, with the one-line reason printed above its `export` in the rendered script."""

    name: str
    value: str
    doc: str
    # value is a path list put before the variable's value on the node at run time (what the nodes' modules and
    # venv set), not a replacement: `export NAME=VALUE${NAME:+:$NAME}`
    prepend: bool = False


class Note(NamedTuple):
    """A value a family chose for a job and why (the planner shows it as a toolkit.job.scaling.Derived)."""

    key: str
    value: str
    rule: str


class AmiTrap(NamedTuple):
    """A device the official ParallelCluster AMIs cannot drive: the error without a custom AMI, its fix, and the
    reminder (a warning) when one is given (None: a custom AMI settles it)."""

    trap: str
    fix: str
    reminder: str | None = None


@dataclasses.dataclass(frozen=True)
class CollectiveReference:
    """A published collectives run a family's results are judged against (toolkit.reports.nccl.judge_reference):
    bus bandwidth in MB/s per collective at one message size on a number of ranks, in the expected state and in
    the failure state it is told apart from; a result nearer the failure figure gets `failure_means` and `fix`."""

    source: str
    called: str  # how verdicts name it: "the post"
    ranks: int
    devices: str  # what its ranks were: "HPUs"
    nodes: int
    size_bytes: int
    figures_mbs: Mapping[str, tuple[int, int]]  # collective: (failure-state figure, expected-state figure)
    expected: str  # the expected state's name, e.g. peer-direct
    failure_means: str
    fix: str


class Family:
    """An accelerator family's answers. One instance per family, registered in toolkit.accelerators.FAMILIES under
    the catalog's `accelerator` value it serves."""

    kind: ClassVar[str]  # the catalog's accelerator field: nvidia, gaudi, none
    device: ClassVar[Device]
    label: ClassVar[str]  # in words, as messages name the family: "NVIDIA GPU", "Gaudi HPU", "CPU"
    units: ClassVar[str]  # a node's devices counted in a summary: GPUs, HPUs, CPUs
    has: ClassVar[str]  # what a queue of it has, in an error: "GPUs", "Gaudi HPUs", "no GPUs"
    slurm_gres: ClassVar[bool] = False  # its devices are Slurm GRES (--gpus-per-node); else one rank per device
    torch_device: ClassVar[str]  # our trainers' --device (toolkit.workloads): cuda, hpu, cpu
    torch_device_why: ClassVar[str]
    collective: ClassVar[str]  # the collective library and torch.distributed backend: nccl, hccl, gloo
    collective_why: ClassVar[str]
    kubernetes_resource: ClassVar[str | None] = None  # the device plugin's extended resource name
    kubernetes_form: ClassVar[bool] = True  # recipes render for Kubernetes on it
    ec2_manufacturer: ClassVar[str | None] = None  # EC2's GpuInfo Manufacturer (toolkit.cluster.pcluster_offline)
    prolog_health_check: ClassVar[bool] = False  # ParallelCluster's (DCGM) GPU health check applies
    # the published run its collectives are judged against; None: the catalog's NCCL floors (nccl_floors)
    collective_reference: ClassVar[CollectiveReference | None] = None
    # The module of our workloads that drives its devices inside a rank where torch alone cannot (a vendor's PyTorch
    # bridge): toolkit.workloads.devices loads it by this name for --device torch_device; None: torch alone.
    workload_runtime: ClassVar[str | None] = None

    def srun_binding(self, instance: InstanceType, tasks_per_node: int, smt_off: bool,
                     holds_node: bool) -> tuple[tuple[str, ...], tuple[Note, ...]]:
        """srun's CPU-binding options for the job's ranks, and why (none: Slurm's own binding)."""
        return (), ()

    def job_env(self, instance: InstanceType, fabric: str) -> list[EnvVar]:
        """The variables its collective library needs on a queue of `fabric` (Queue.fabric: modern|legacy|none)."""
        return []

    def library_dirs(self, instance: InstanceType, fabric: str) -> tuple[tuple[str, ...], str | None]:
        """Directories the job's loader path gets for its collective library's network plugin, and why."""
        return (), None

    def loader_checks(self, *, fabric: str, python_ranks: bool, gpus_per_node: int,
                      environ: Mapping[str, str]) -> list[str]:
        """What the pre-flight and `hpc cluster doctor --recipe` ask the loader (toolkit.node.loader_check's
        arguments) for a job of it."""
        return []

    def loader_fix(self, library: str, *, binary: bool) -> str | None:
        """How to make `library` (one its loader_checks names) resolve, or None when it is not its own."""
        return None

    def official_ami_trap(self, instance: InstanceType) -> AmiTrap | None:
        """Why the official AMIs cannot run `instance`, or None when they can."""
        return None

    def custom_ami_note(self) -> str:
        """What a cluster's custom AMI must be, for a queue of it (appended to the config's CustomAmi comment)."""
        return ""
