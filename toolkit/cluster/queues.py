"""A cluster's Slurm queues as the job side needs them, read from a ParallelCluster v3 config.

Toolkit-specific queue settings ride on the queue's own ParallelCluster `Tags` (the schema allows them and
they are applied to the instances, so they are visible on the cluster too):
  hpc:efa-stack       modern | legacy | none  (which EFA/NCCL environment the nodes' software wants)
  hpc:ranks-per-node  ranks per node on a CPU queue (GPU queues use one rank per GPU)
  hpc:cpus-per-task   overrides CPUs per node / ranks (the local test cluster's nodes share two real cores)
  hpc:topology        the queue's topology.conf (`hpc cluster topology`; relative: to the config's directory):
                      jobs start their ranks in its network order

CPUs per node are what ParallelCluster declares to Slurm (`NodeName=... CPUs=N`): the instance's vCPUs, or its
physical cores where a compute resource sets `DisableSimultaneousMultithreading: true` (aws-parallelcluster
pcluster/schemas/cluster_schema.py, SlurmComputeResourceSchema; aws-parallelcluster-cookbook
cookbooks/aws-parallelcluster-slurm/files/default/head_node_slurm/slurm/templates/common/
slurm_parallelcluster_utils.conf, cpus_property: vCPUs // threads per core when SMT is off).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path
from typing import Any, Literal

from toolkit.catalog import InstanceType, catalog, instance
from toolkit.errors import HpcError, UsageError
from toolkit.node.promise import Promise
from toolkit.textfile import read_text

EfaStack = Literal["modern", "legacy", "none"]
EFA_STACKS = ("modern", "legacy", "none")
HEAD_NODE_CONFIG = Path("/opt/parallelcluster/shared/cluster-config.yaml")
CLUSTER_CONFIG_ENV = "HPC_CLUSTER_CONFIG"
TAG_EFA_STACK = "hpc:efa-stack"
TAG_RANKS_PER_NODE = "hpc:ranks-per-node"
TAG_CPUS_PER_TASK = "hpc:cpus-per-task"
TAG_TOPOLOGY = "hpc:topology"
HELPER_PARTITION_ENV = "HPC_HELPER_PARTITION"  # overrides helper_partition_of(): a queue of the config
SMT_KEY = "DisableSimultaneousMultithreading"  # ParallelCluster's key, on a Slurm compute resource


# Each ParallelCluster 3.16 OS's own /usr/bin/python3 (the distributions' base images); what a node runs hpc's
# node-side code with when the job's software brings no python3 >= 3.9 (docs/node-contract.md).
OS_PYTHON3 = {"alinux2023": (3, 9), "rocky9": (3, 9), "rhel9": (3, 9), "ubuntu2204": (3, 10), "ubuntu2404": (3, 12),
              "rocky8": (3, 6), "rhel8": (3, 6), "alinux2": (3, 7)}


@dataclasses.dataclass(frozen=True)
class Queue:
    name: str
    instance_type: str
    max_nodes: int
    efa_stack: EfaStack = "modern"
    ranks_per_node: int | None = None
    cpus_per_task_override: int | None = None
    fsx_mount: str | None = None
    efa_enabled: bool = False  # Efa/Enabled on the queue's (first) compute resource
    static_nodes: int = 0  # MinCount summed: nodes that are always up (the rest start on demand)
    smt_disabled: bool = False  # DisableSimultaneousMultithreading on a compute resource: one CPU per core
    from_config: bool = False  # read from a ParallelCluster config (False: default_queue(), assumed)
    # Where the pre-flight's one-task helper job (hpc-exclude-<job>) goes: the config's smallest queue
    # (helper_partition_of); None: the job's own partition
    helper_partition: str | None = None
    os: str | None = None  # Image/Os of the cluster config: what the nodes' own python3 is (OS_PYTHON3)
    shared_mounts: tuple[str, ...] = ()  # every SharedStorage MountDir of the config (FSx, EFS, EBS, RAID)
    topology: str | None = None  # its topology.conf (tag hpc:topology, toolkit.cluster.topology), an absolute path

    @property
    def os_python3(self) -> tuple[int, int] | None:
        """The nodes' /usr/bin/python3 version, where the OS says it (None: not known, e.g. no config)."""
        return OS_PYTHON3.get(self.os or "")

    @property
    def instance(self) -> InstanceType:
        return instance(self.instance_type)

    def promise(self) -> Promise:
        """What a node of this queue must have, for the node-side checks (toolkit.node.promise)."""
        from toolkit.accelerators.nvidia import OFI_NCCL_DIRS

        it = self.instance
        return Promise(queue=self.name, instance_type=self.instance_type, accelerator=it.accelerator,
                       gpus=self.gpus_per_node, gpu_model=it.gpu_model, proprietary_driver=it.proprietary_driver,
                       efa_interfaces=it.efa_interfaces, efa_stack=self.efa_stack, fabric=self.fabric,
                       fsx_mount=self.fsx_mount, plugin_dirs=tuple(OFI_NCCL_DIRS))

    @property
    def gpus_per_node(self) -> int:
        return self.instance.gpus if self.instance.accelerator != "none" else 0

    @property
    def efa_interfaces(self) -> int:
        """EFA devices a node of this queue uses (0 when EFA is off in the config)."""
        return self.instance.efa_interfaces if self.efa_enabled else 0

    @property
    def fabric(self) -> EfaStack:
        """The EFA/NCCL stack jobs on this queue set up: the declared one where the queue really has EFA enabled
        (Efa/Enabled on an EFA-capable instance), else none (TCP). The one place this is decided."""
        return self.efa_stack if self.efa_enabled else "none"

    @property
    def has_dynamic_nodes(self) -> bool:
        """Nodes that boot on demand: jobs must wait for all of them (sbatch --wait-all-nodes=1)."""
        return self.static_nodes < self.max_nodes

    @property
    def tasks_per_node(self) -> int:
        """One rank per GPU on accelerator queues; the declared count (default 1) on CPU queues."""
        if self.gpus_per_node:
            return self.gpus_per_node
        return self.ranks_per_node or 1

    @property
    def smt_off(self) -> bool:
        """SMT is really off: the config turns it off on an instance that has it (ParallelCluster ignores the
        key on one thread per core: disable_simultaneous_multithreading_manually)."""
        return self.smt_disabled and self.instance.threads_per_core > 1

    @property
    def cpus_per_node(self) -> int:
        """The CPUs Slurm sees on a node: what ParallelCluster declares (CPUs=N), physical cores with SMT off."""
        return self.instance.cores if self.smt_off else self.instance.vcpus

    @property
    def cpus_per_node_rule(self) -> str:
        return (f"{self.instance.cores} cores (SMT off)" if self.smt_off else f"{self.instance.vcpus} vCPUs")

    @property
    def cpus_per_task(self) -> int:
        return self.cpus_per_task_override or max(1, self.cpus_per_node // self.tasks_per_node)

    @property
    def cpus_rule(self) -> str:
        """Why each rank gets cpus_per_task CPUs (the plan's Derived reason)."""
        if self.cpus_per_task_override:
            return f"queue override (tag {TAG_CPUS_PER_TASK})"
        return f"{self.cpus_per_node_rule} / {self.tasks_per_node} ranks"


def default_queue() -> Queue:
    """The queue assumed when no cluster config is given or found: one p3dn.24xlarge queue."""
    return Queue(name="p3dn", instance_type="p3dn.24xlarge", max_nodes=16, efa_stack="modern", fsx_mount="/fsx",
                 efa_enabled=True)


def _tags(section: dict[str, Any]) -> dict[str, str]:
    return {str(t.get("Key")): str(t.get("Value")) for t in section.get("Tags") or [] if isinstance(t, dict)}


def _whole(value: Any, what: str, source: str) -> int:
    """A count the config gives (MaxCount, MinCount, a count tag) as pcluster's schema reads it (an integer, or its
    digits as text), else one error naming the key: a template's placeholder was left in, or a typo."""
    from toolkit.cluster.configfile import template_error, template_variable

    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if (variable := template_variable(value)) is not None:
        raise template_error(f"{source}: {what}", variable, source)
    raise HpcError(f"{source}: {what} is {value!r}, not a whole number",
                   fix="write the count as a number (a template's placeholder is meant to be replaced first); "
                       "`hpc cluster validate` checks the whole file")


def queues_from_config(config: dict[str, Any], source: str = "<config>") -> dict[str, Queue]:
    """Queues of a ParallelCluster v3 config dict, by name (first compute resource's instance type)."""
    from toolkit.cluster.configfile import template_error, template_variable

    fsx_mount = next(
        (s.get("MountDir") for s in config.get("SharedStorage") or [] if s.get("StorageType") == "FsxLustre"),
        None,
    )
    # ParallelCluster mounts every SharedStorage entry on every node, a relative MountDir under / (the cookbook's
    # format_directory: aws/aws-parallelcluster-cookbook, recipes/config/mount_home.rb and mount_shared.rb)
    shared = tuple(dict.fromkeys("/" + str(s["MountDir"]).strip("/") for s in config.get("SharedStorage") or []
                                 if isinstance(s, dict) and s.get("MountDir")))
    queues: dict[str, Queue] = {}
    for q in (config.get("Scheduling") or {}).get("SlurmQueues") or []:
        name = q.get("Name")
        resources = q.get("ComputeResources") or []
        if not name or not resources:
            raise HpcError(f"{source}: queue {name or '?'} has no name or no ComputeResources",
                           fix="run `hpc cluster validate` on the file")
        first = resources[0]
        itype = first.get("InstanceType") or ((first.get("Instances") or [{}])[0].get("InstanceType"))
        if (variable := template_variable(itype)) is not None:
            raise template_error(f"{source}: queue {name}: InstanceType", variable, source)
        tags = _tags(q)
        # a type outside the catalog: the file's word for EFA (its facts are asked for only if a job uses the queue)
        known = catalog().get(itype)
        efa_enabled = bool((first.get("Efa") or {}).get("Enabled")) and (known is None or known.has_efa)
        stack = tags.get(TAG_EFA_STACK, "modern" if efa_enabled else "none")
        if stack not in EFA_STACKS:
            raise HpcError(f"{source}: queue {name}: tag {TAG_EFA_STACK}={stack!r} is not one of {EFA_STACKS}",
                           fix=f"set the tag to one of: {', '.join(EFA_STACKS)}")
        where = f"queue {name}, compute resource"
        queues[name] = Queue(
            name=name,
            instance_type=itype,
            max_nodes=sum(_whole(r.get("MaxCount", 10), f"{where} {r.get('Name')}: MaxCount", source)
                          for r in resources),
            efa_stack=stack,  # type: ignore[arg-type]
            ranks_per_node=(_whole(tags[TAG_RANKS_PER_NODE], f"queue {name}: tag {TAG_RANKS_PER_NODE}", source)
                            if TAG_RANKS_PER_NODE in tags else None),
            cpus_per_task_override=(_whole(tags[TAG_CPUS_PER_TASK], f"queue {name}: tag {TAG_CPUS_PER_TASK}", source)
                                    if TAG_CPUS_PER_TASK in tags else None),
            fsx_mount=fsx_mount,
            efa_enabled=efa_enabled,
            static_nodes=sum(_whole(r.get("MinCount", 0), f"{where} {r.get('Name')}: MinCount", source)
                             for r in resources),
            # A job may land on any of the queue's compute resources: one with SMT off bounds the CPUs it may ask.
            smt_disabled=any(r.get(SMT_KEY) is True for r in resources),
            from_config=True,
            os=(config.get("Image") or {}).get("Os"),
            shared_mounts=shared,
            topology=_topology_path(tags.get(TAG_TOPOLOGY), source),
        )
    helper = helper_partition_of(queues, source)
    return {name: dataclasses.replace(q, helper_partition=helper) for name, q in queues.items()}


def _topology_path(value: str | None, source: str) -> str | None:
    """The tag's path, a relative one taken from the config's directory (where the admin keeps both)."""
    if not value:
        return None
    path = Path(value)
    return str(path if path.is_absolute() or source.startswith("<") else Path(source).parent / path)


def helper_partition_of(queues: dict[str, Queue], source: str = "<config>") -> str | None:
    """The queue for one-task helper jobs (the pre-flight's hpc-exclude-<job>): $HPC_HELPER_PARTITION, else the
    smallest: a queue without accelerators before any with them (a helper must never hold an exclusive GPU node
    while a CPU queue exists), then the fewest CPUs per node; a type outside the catalog counts as an accelerator
    queue (its size is unknown). None for a config without queues."""
    chosen = os.environ.get(HELPER_PARTITION_ENV)
    if chosen:
        if chosen not in queues:
            raise HpcError(f"${HELPER_PARTITION_ENV}={chosen} is not a queue of {source}",
                           fix=f"set it to one of: {', '.join(queues)} (or unset it: the smallest queue is used)")
        return chosen

    def size(queue: Queue) -> tuple[int, int]:
        known = catalog().get(queue.instance_type)
        if known is None:
            return 1, 1 << 30
        return (0 if known.accelerator == "none" else 1), queue.cpus_per_node

    return min(queues.values(), key=size).name if queues else None  # min keeps the config's order among equals


def _read(path: str | Path) -> tuple[Path, dict[str, Any]]:
    from toolkit.cluster import yamlsource

    path = Path(path)
    text = read_text(path, "cluster config", fix="pass an existing cluster config file to --cluster")
    config, _, problems = yamlsource.parse(text, str(path))
    if problems:
        where = f"{path}:{problems[0].line}" if problems[0].line else str(path)
        raise HpcError(f"{where}: {problems[0].message}", fix="run `hpc cluster validate` on it")
    assert config is not None, "yamlsource.parse reports a problem whenever it returns no config"
    return path, config


def load_queues(path: str | Path) -> dict[str, Queue]:
    path, config = _read(path)
    return queues_from_config(config, source=str(path))


def cluster_config_candidates() -> list[Path]:
    """Where the config of the cluster we run on is looked for, in order (the first existing file wins).

    $HPC_CLUSTER_CONFIG first, then the ParallelCluster head node's copy.
    """
    explicit = os.environ.get(CLUSTER_CONFIG_ENV)
    return ([Path(explicit)] if explicit else []) + [HEAD_NODE_CONFIG]


def pick_queue(queues: dict[str, Queue], name: str | None, source: str) -> Queue:
    """The named queue, or the config's first one (ParallelCluster makes the first queue the default partition)."""
    if name is None:
        return next(iter(queues.values()))
    if name not in queues:
        close = difflib.get_close_matches(name, list(queues), n=1)
        raise UsageError(f"{source} has no queue {name!r}" + (f"; did you mean {close[0]}?" if close else ""),
                         fix=f"use --queue {' | '.join(queues)}")
    return queues[name]


def resolve_queue(cluster: str | Path | None, queue: str | None) -> tuple[Queue, str]:
    """The queue a job goes to, and a sentence saying where it came from.

    `--cluster FILE [--queue Q]`, else the cluster's own config (cluster_config_candidates()), else
    default_queue(), in which case the sentence says it was assumed (the CLI prints it on stderr).
    """
    explicit = os.environ.get(CLUSTER_CONFIG_ENV)
    if cluster is None and explicit and not Path(explicit).is_file():
        raise HpcError(f"${CLUSTER_CONFIG_ENV} names {explicit}, which does not exist",
                       fix=f"point ${CLUSTER_CONFIG_ENV} at a cluster config, or unset it")
    path = Path(cluster) if cluster is not None else next((p for p in cluster_config_candidates() if p.is_file()), None)
    if path is not None:
        path, config = _read(path)
        queues = queues_from_config(config, source=str(path))
        if not queues:
            raise no_queues_error(path, config)
        chosen = pick_queue(queues, queue, str(path))
        how = "--cluster" if cluster is not None else "this cluster's own config"
        return chosen, f"queue {chosen.name} ({chosen.instance_type}) from {path} ({how})"
    default = default_queue()
    if queue not in (None, default.name):
        raise UsageError(f"--queue {queue} given, but no cluster config was given or found",
                       fix="pass --cluster FILE (a ParallelCluster config) with --queue")
    looked = ", ".join(str(p) for p in cluster_config_candidates())
    return default, (f"assumed the default queue {default.name} ({default.instance_type}, "
                     f"{default.gpus_per_node} GPUs per node): no --cluster given and no cluster config at {looked}")


def this_cluster_config() -> Path:
    """The config of the cluster this runs on: $HPC_CLUSTER_CONFIG, else the head node's."""
    path = next((p for p in cluster_config_candidates() if p.is_file()), None)
    if path is None:
        raise HpcError(f"no FILE given and {HEAD_NODE_CONFIG} does not exist (this is not a ParallelCluster "
                       "head node)",
                       fix=f"pass the cluster config (hpc cluster show cluster.yaml) or set ${CLUSTER_CONFIG_ENV}")
    return path


def _resource_type(resource: dict) -> str | None:
    """A compute resource's instance type: InstanceType, else its Instances list (several types: joined by ',')."""
    if isinstance(resource.get("InstanceType"), str):
        return resource["InstanceType"]
    names = [i.get("InstanceType") for i in resource.get("Instances") or [] if isinstance(i, dict)]
    return ",".join(str(n) for n in names) or None


def no_queues_error(path: str | Path, config: dict[str, Any]) -> HpcError:
    """A config without Slurm queues: an AWS Batch cluster's (a scheduler the pinned pcluster no longer has:
    aws-parallelcluster 3.16.1 pcluster/constants.py SUPPORTED_SCHEDULERS), or one that lists none."""
    scheduling = config.get("Scheduling")
    scheduler = scheduling.get("Scheduler") if isinstance(scheduling, dict) else None
    if scheduler not in (None, "slurm"):
        return HpcError(f"{path}: Scheduling/Scheduler is {scheduler!r}, and hpc's queues are Slurm queues",
                        fix="give the config of a Slurm cluster (Scheduler: slurm, Scheduling/SlurmQueues)")
    return HpcError(f"{path} defines no Slurm queues", fix="add Scheduling/SlurmQueues to the config")


def queue_summaries(path: str | Path) -> list[dict[str, Any]]:
    """What a researcher needs to pick a queue: one dict per compute resource of each queue of the config at
    `path`. A type outside the catalog is listed with known False and its facts None (unknown), not refused."""
    path, config = _read(path)
    queues = queues_from_config(config, source=str(path))
    if not queues:
        raise no_queues_error(path, config)
    rows = []
    for raw in (config.get("Scheduling") or {}).get("SlurmQueues") or []:
        queue = queues[raw["Name"]]
        for resource in raw.get("ComputeResources") or []:
            itype = _resource_type(resource) or "?"
            # the compute resource as a queue of its own: the CPU and EFA rules are Queue's, applied to it alone
            alone = dataclasses.replace(
                queue, instance_type=itype.split(",")[0], max_nodes=_whole(resource.get("MaxCount", 10), "MaxCount",
                                                                           str(path)),
                static_nodes=_whole(resource.get("MinCount", 0), "MinCount", str(path)),
                smt_disabled=resource.get(SMT_KEY) is True,
                efa_enabled=bool((resource.get("Efa") or {}).get("Enabled")))
            row: dict[str, Any] = {
                "queue": queue.name, "compute_resource": resource.get("Name"), "instance_type": itype,
                "known": alone.instance_type in catalog(), "min_nodes": alone.static_nodes,
                "max_nodes": alone.max_nodes, "efa_stack": queue.efa_stack, "fsx_mount": queue.fsx_mount,
                "gpus_per_node": None, "gpu_model": None, "efa_interfaces": None, "tasks_per_node": None,
                "cpus_per_node": None, "smt_off": None, "cpus_per_task": None}
            if row["known"]:
                row |= {"gpus_per_node": alone.gpus_per_node, "gpu_model": alone.instance.gpu_model,
                        "efa_interfaces": alone.efa_interfaces,
                        "tasks_per_node": alone.tasks_per_node, "cpus_per_node": alone.cpus_per_node,
                        "smt_off": alone.smt_off, "cpus_per_task": alone.cpus_per_task}
            rows.append(row)
    return rows
