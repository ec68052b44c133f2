"""`hpc cluster config`: queues and options -> a ParallelCluster v3 config, emitted by a YAML serializer.

ClusterSpec (what the admin asked for) -> build_config() -> a commented YAML document -> render() -> text.
The same spec always gives the same bytes; comments mark what a human edits (key pair, subnet, node counts,
AMI, FSx size) and explain the traps (V100 driver, reservations and placement groups).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import re
import shlex
import textwrap
from pathlib import Path
from typing import Any, Literal

from toolkit.accelerators import FAMILIES, family_or_none
from toolkit.catalog import InstanceType
from toolkit.cluster import checks, flags
from toolkit.cluster.queues import EFA_STACKS, TAG_EFA_STACK, TAG_RANKS_PER_NODE
from toolkit.errors import HpcError, UsageError
from toolkit.textfile import refuse_overwrite

FsxDeployment = Literal["SCRATCH_2", "PERSISTENT_2"]
FSX_DEPLOYMENTS = ("SCRATCH_2", "PERSISTENT_2")
OSES = ("alinux2023", "ubuntu2204", "ubuntu2404", "rhel8", "rocky8", "rhel9", "rocky9")  # pcluster 3.16
CLUSTER_NAME = re.compile(r"^[a-zA-Z][a-zA-Z0-9-]{0,59}$")
REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")
FSX_MOUNT = "/fsx"
# FSx for Lustre baseline throughput per TiB of storage (AWS, FSx for Lustre User Guide, "Amazon FSx for Lustre
# performance" / ssd-storage): SCRATCH_2 200 MB/s/TiB (bursts to 1300 on credits); PERSISTENT_2 the chosen
# PerUnitStorageThroughput tier. Capacity: 1.2 TiB, then steps of 2.4 TiB (1200 GiB, n x 2400 GiB).
SCRATCH_2_MBS_PER_TIB = 200
PERSISTENT_2_TIERS = (125, 250, 500, 1000)  # MB/s/TiB (FSx API: PerUnitStorageThroughput for PERSISTENT_2)
# Who may SSH to the head node unless --ssh-allowed-ips says: private 10.x addresses (a bastion or VPN inside a
# VPC such as the 10.0.0.0/16 that `pcluster configure` creates: aws-parallelcluster cli/src/pcluster/networking/
# vpc_factory.py), never the internet, which is ParallelCluster's own default (HeadNodeSsh AllowedIps defaults to
# CIDR_ALL_IPS 0.0.0.0/0: cli/src/pcluster/config/cluster_config.py).
SSH_ALLOWED_IPS = "10.0.0.0/8"
INSTALL_FIX = "pip install 'hpc-toolkit[admin]'"
HEAD_ROOT_GIB = 100  # head node root volume: Slurm state, logs and shared /home builds outgrow the 40 GiB AMI
COMPUTE_ROOT_GIB = 200  # accelerator nodes' root volume
SCRATCH = "/scratch"
IDLE_MINUTES_ACCELERATED = 30  # GPU nodes take minutes to boot: keep them between jobs a little longer
IDLE_MINUTES = 10  # ParallelCluster's default
# ParallelCluster runs its DCGM GPU check in every job's prolog, and its health check manager stops a check after
# 600 s (aws-parallelcluster-cookbook, config_slurm/scripts/health_check_manager.py, health_check_timeout). On p4d/p5
# the check can outlast ParallelCluster's BatchStartTimeout of 180 s (its slurm.conf.erb): the job fails with
# "Prolog hung" / "batch job missing" (aws-parallelcluster#6777, a known issue). Both settings below are Slurm's own
# (slurm.conf(5), 25.11 as in ParallelCluster 3.16.1) and pass pcluster's CustomSlurmSettings deny-list
# (pcluster/validators/slurm_settings_validator.py: Prolog, Epilog and SlurmctldParameters are denied, these not).
PROLOG_TIMEOUT_S = 720  # a prolog still running after this is killed: the job is requeued and the node drained
BATCH_START_TIMEOUT_S = 780  # > PROLOG_TIMEOUT_S: a slow check never turns a batch job into a missing one first
# ParallelCluster >= 3.11 installs enroot and pyxis with pyxis off (its configs kept in /opt/parallelcluster/examples:
# aws-parallelcluster-cookbook PR #2820). AWS's samples turn it on with two custom actions: the head node's moves
# the enroot, SPANK and pyxis configs into place and reconfigures Slurm, each compute node's does the same on start
# (aws-samples/aws-parallelcluster-post-install-scripts enable-pyxis/README.md, head-node/ and compute-node/
# postscript.sh; AWS ParallelCluster User Guide, "Running containerized jobs with Pyxis").
# They run as root on every node, so they are pinned to a commit: enable-pyxis/ exists at this one (the head of
# that repository's pull request #50) and never on its main branch, where a URL naming it fails OnNodeConfigured
# and the cluster ends CREATE_FAILED. (main's pyxis/postinstall.sh is no pin: it downloads a cookbook template
# from a branch as root.) --pyxis-script runs the toolkit's own script (enable-pyxis.sh) from the admin's S3.
PYXIS_COMMIT = "5f87e2af8e3bce3c5dc2e699336b3cd36e3aaa1f"
PYXIS_SCRIPTS = ("https://raw.githubusercontent.com/aws-samples/aws-parallelcluster-post-install-scripts/"
                 f"{PYXIS_COMMIT}/enable-pyxis")
PYXIS_HEAD_SCRIPT = f"{PYXIS_SCRIPTS}/head-node/postscript.sh"
PYXIS_COMPUTE_SCRIPT = f"{PYXIS_SCRIPTS}/compute-node/postscript.sh"
PYXIS_SCRIPT_NAME = "enable-pyxis.sh"  # the toolkit's own, in this package; its argument says the node's role


@dataclasses.dataclass(frozen=True)
class QueueSpec:
    name: str
    instance_type: str
    max_nodes: int
    efa_stack: str | None = None  # modern | legacy | none; default: modern with EFA, none without
    ranks_per_node: int | None = None  # CPU queues only (GPU queues run one rank per GPU)


@dataclasses.dataclass(frozen=True)
class FsxSpec:
    deployment: FsxDeployment = "SCRATCH_2"
    capacity_gib: int = 1200  # with throughput_mbs: the least capacity (sized up to reach the throughput)
    import_path: str | None = None  # s3://bucket/prefix
    throughput_mbs: int | None = None  # MB/s the jobs read from /fsx at once: sizes the file system


@dataclasses.dataclass(frozen=True)
class FsxSize:
    capacity_gib: int
    per_unit_mbs: int  # baseline MB/s per TiB

    @property
    def baseline_mbs(self) -> int:
        return int(self.capacity_gib / 1024 * self.per_unit_mbs)


def fsx_size(fsx: FsxSpec) -> FsxSize:
    """The smallest file system of the deployment type (no smaller than --fsx-capacity) whose baseline throughput
    reaches fsx.throughput_mbs; without one, --fsx-capacity (PERSISTENT_2 at its lowest tier)."""
    tiers = (SCRATCH_2_MBS_PER_TIB,) if fsx.deployment == "SCRATCH_2" else PERSISTENT_2_TIERS
    capacity = fsx.capacity_gib
    if fsx.throughput_mbs:
        needed = math.ceil(fsx.throughput_mbs / tiers[-1] * 1024)  # GiB at the highest tier
        capacity = max(capacity, 1200 if needed <= 1200 else 2400 * math.ceil(needed / 2400))
        return FsxSize(capacity, next(t for t in tiers if capacity / 1024 * t >= fsx.throughput_mbs))
    return FsxSize(capacity, tiers[0])


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    name: str
    region: str
    head_subnet: str
    compute_subnet: str  # the same as head_subnet when one --subnet serves both (it must then be private)
    key_name: str
    queues: tuple[QueueSpec, ...]
    head_node: str = "c5n.18xlarge"
    os: str = "ubuntu2204"
    custom_ami: str | None = None
    fsx: FsxSpec | None = None
    capacity_reservation: str | None = None
    reservation_queue: str | None = None  # which queue uses it (default: the only accelerator queue)
    capacity_block: str | None = None  # a Capacity Block for ML (its reservation id)
    capacity_block_queue: str | None = None  # which queue uses it (default: the only accelerator queue)
    post_install: str | None = None
    ssh_allowed_ips: str = SSH_ALLOWED_IPS  # a CIDR or a prefix list id (pl-...)
    pyxis: bool = False  # enable pyxis (srun --container-image) with AWS's custom actions (PYXIS_*_SCRIPT)
    pyxis_script: str | None = None  # s3:// URL of the admin's copy of enable-pyxis.sh, run instead (implies pyxis)

    @property
    def pyxis_on(self) -> bool:
        return self.pyxis or bool(self.pyxis_script)


def parse_queue(text: str, option: str = "--queue-spec") -> QueueSpec:
    """`NAME=INSTANCE_TYPE:MAX_NODES[,efa-stack=modern|legacy|none][,ranks-per-node=N]` -> QueueSpec, its name and
    instance type checked (flags.py: the one set of checks `cluster config` and `queue add` share)."""
    usage = f"write {option} NAME=INSTANCE_TYPE:MAX_NODES, e.g. {option} p3dn=p3dn.24xlarge:4"
    head, *options = text.split(",")
    match = re.fullmatch(r"([^=]+)=([^:]+):(\d+)", head.strip())
    if not match:
        raise UsageError(f"{option} {text!r} is not NAME=INSTANCE_TYPE:MAX_NODES", fix=usage)
    name, itype, max_nodes = match.group(1), match.group(2), int(match.group(3))
    flags.queue_name(name, option, text)
    if max_nodes < 1:
        raise UsageError(f"{option} {text!r}: MAX_NODES must be at least 1", fix=f"e.g. {option} {name}={itype}:4")
    itype = flags.instance_type(itype, option, text).name
    extra: dict[str, Any] = {}
    for item in options:
        key, _, value = item.partition("=")
        if key == "efa-stack" and value in EFA_STACKS:
            extra["efa_stack"] = value
        elif key == "ranks-per-node" and value.isdigit() and int(value) > 0:
            extra["ranks_per_node"] = int(value)
        else:
            raise UsageError(f"{option} {text!r}: unknown option {item!r}",
                             fix=f"options are efa-stack={'|'.join(EFA_STACKS)} and ranks-per-node=N")
    return QueueSpec(name, itype, max_nodes, **extra)


def _check_spec(spec: ClusterSpec) -> dict[str, InstanceType]:
    """Usage errors first (exit 2), then the facts (unknown instance type, the V100 trap: exit 1)."""
    if not CLUSTER_NAME.match(spec.name):
        raise UsageError(f"--name {spec.name!r} is not a ParallelCluster cluster name",
                         fix="start with a letter; letters, digits and '-' only; at most 60 characters")
    if not REGION.match(spec.region):
        raise UsageError(f"--region {spec.region!r} is not an AWS region name", fix="e.g. --region us-east-1")
    if spec.os not in OSES:
        raise UsageError(f"--os {spec.os!r} is not supported by ParallelCluster 3.16",
                         fix=f"use one of: {', '.join(OSES)} (alinux2 is gone since 3.16)")
    if not spec.queues:
        raise UsageError("no --queue-spec given", fix="add --queue-spec NAME=INSTANCE_TYPE:MAX_NODES")
    names = [q.name for q in spec.queues]
    for queue in spec.queues:  # each one as parse_queue checks a --queue-spec value (a spec may be built in code)
        flags.queue_name(queue.name, "--queue-spec", f"{queue.name}={queue.instance_type}:{queue.max_nodes}")
        if names.count(queue.name) > 1:
            raise UsageError(f"queue {queue.name!r} is given twice", fix="give every queue its own name")
        if queue.max_nodes < 1:
            raise UsageError(f"queue {queue.name!r}: MAX_NODES must be at least 1", fix="e.g. p3dn=p3dn.24xlarge:4")
    if spec.fsx:
        _check_fsx(spec.fsx)
    _check_ssh_allowed_ips(spec.ssh_allowed_ips)
    if spec.capacity_reservation:
        flags.reservation_id(spec.capacity_reservation, "--capacity-reservation")
    if spec.capacity_block:
        flags.reservation_id(spec.capacity_block, "--capacity-block")
    if spec.pyxis_script and not re.fullmatch(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/\S*[^/\s]", spec.pyxis_script):
        raise UsageError(f"--pyxis-script {spec.pyxis_script!r} is not the s3:// URL of a script",
                         fix=f"write the script with `hpc cluster pyxis-script -o {PYXIS_SCRIPT_NAME}`, upload it "
                         f"(aws s3 cp {PYXIS_SCRIPT_NAME} s3://BUCKET/KEY) and give --pyxis-script s3://BUCKET/KEY")
    types = {q.name: flags.instance_type(q.instance_type, "--queue-spec", f"{q.name}={q.instance_type}:{q.max_nodes}")
             for q in spec.queues}
    for queue in spec.queues:
        if queue.ranks_per_node and types[queue.name].accelerator != "none":
            raise UsageError(f"queue {queue.name!r}: ranks-per-node is for CPU queues",
                             fix="accelerator queues run one rank per accelerator: drop ranks-per-node")
        trap = checks.ami_trap(types[queue.name])
        if trap is not None and not spec.custom_ami:
            raise HpcError(trap.trap, fix=trap.fix.replace("(Image/CustomAmi or the queue's Image/CustomAmi)",
                                                           "(pass it as --custom-ami AMI_ID)"))
    return types


def _check_fsx(fsx: FsxSpec) -> None:
    if fsx.deployment not in FSX_DEPLOYMENTS:
        raise UsageError(f"--fsx-deployment {fsx.deployment!r} is not supported",
                         fix=f"use one of: {', '.join(FSX_DEPLOYMENTS)}")
    if not (fsx.capacity_gib == 1200 or (fsx.capacity_gib > 0 and fsx.capacity_gib % 2400 == 0)):
        raise UsageError(f"--fsx-capacity {fsx.capacity_gib}: FSx for Lustre {fsx.deployment} takes 1200 GiB or "
                         "a multiple of 2400 GiB", fix="e.g. --fsx-capacity 1200 or 2400")
    if fsx.throughput_mbs is not None and fsx.throughput_mbs < 1:
        raise UsageError(f"--fsx-throughput {fsx.throughput_mbs}: MB/s must be at least 1",
                         fix="give the MB/s your jobs read from /fsx at once, e.g. --fsx-throughput 2000")
    if fsx.import_path and not re.match(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$", fsx.import_path):
        raise UsageError(f"--fsx-import {fsx.import_path!r} is not an S3 URL", fix="e.g. s3://my-bucket/prefix")


def _check_ssh_allowed_ips(value: str) -> None:
    if re.fullmatch(r"pl-[0-9a-f]{8,17}", value):
        return
    try:
        ipaddress.ip_network(value)
    except ValueError:
        raise UsageError(f"--ssh-allowed-ips {value!r} is neither a CIDR nor a prefix list id",
                         fix="e.g. --ssh-allowed-ips 203.0.113.7/32 (your address) or pl-0123456789abcdef0") from None


def _target_queue(option: str, reservation: str | None, named: str | None,
                  types: dict[str, InstanceType]) -> str | None:
    """The queue a reservation option applies to: the one named, else the only (accelerator) queue."""
    if not reservation:
        return None
    if named:
        if named not in types:
            raise UsageError(f"{option} names queue {named!r}, which is not given",
                             fix=f"use one of: {', '.join(types)}")
        return named
    accelerated = [name for name, it in types.items() if it.accelerator != "none"]
    if len(types) == 1 or len(accelerated) == 1:
        return next(iter(types)) if len(types) == 1 else accelerated[0]
    raise UsageError(f"{option}: more than one queue could use it", fix=f"write {option} QUEUE=cr-...")


def _ruamel():
    try:
        import ruamel.yaml
        import ruamel.yaml.comments
        import ruamel.yaml.scalarstring
    except ImportError:
        raise HpcError("ruamel.yaml is not installed: `hpc cluster config` writes commented YAML with it",
                       fix=INSTALL_FIX) from None
    return ruamel.yaml


def _map(*pairs: tuple[str, Any], **notes: str):
    """A YAML mapping from (key, value) pairs; `notes` become end-of-line comments on those keys."""
    mapping = _ruamel().comments.CommentedMap(pairs)
    for key, text in notes.items():
        _note(mapping, key, text)
    return mapping


def _note(mapping, key: str, text: str) -> None:
    """An end-of-line comment two spaces after the value (ruamel's public call aligns later comments to
    the first one's column, which drifts to one space)."""
    from ruamel.yaml.error import CommentMark
    from ruamel.yaml.tokens import CommentToken

    mapping._yaml_add_eol_comment([CommentToken(f" # {text}", CommentMark(0)), None], key=key)


def _seq(*items: Any):
    return _ruamel().comments.CommentedSeq(items)


def _pyxis_action(spec: ClusterSpec, role: str, pinned: str):
    """The custom action that turns pyxis on for ROLE (head-node, compute-node): the admin's copy of the toolkit's
    script on S3, else AWS's script pinned to a commit."""
    if spec.pyxis_script:
        return _map(("Script", spec.pyxis_script), ("Args", _seq(role)))
    return _map(("Script", pinned))


def _s3_read_access(*urls: str | None):
    """Iam for a node that reads scripts from these s3:// URLs (None where none is on S3)."""
    buckets = list(dict.fromkeys(b for url in urls if url and (b := _bucket(url))))
    if not buckets:
        return None
    return _map(("S3Access", _seq(*(_map(("BucketName", b), ("EnableWriteAccess", False)) for b in buckets))))


def _bucket(url: str) -> str | None:
    return url[len("s3://"):].split("/")[0] if url.startswith("s3://") else None


def _several_nics(it: InstanceType) -> bool:
    """ParallelCluster 3.16 gives these nodes more than one network interface: one per network card, or a
    primary plus an EFA-only one on single-card EFA types; AWS cannot auto-assign a public IP to them."""
    return it.network_cards > 1 or it.has_efa


def _compute_resource(queue: QueueSpec, it: InstanceType, reservation: str | None, block: bool):
    notes = ({"MinCount": "Capacity Block: every reserved node runs for the block's duration (MinCount = MaxCount)",
              "MaxCount": "edit: the number of instances in the Capacity Block"} if block else
             {"MinCount": "0: nodes start on demand and stop when idle", "MaxCount": "edit: most nodes a job can get"})
    resource = _map(("Name", queue.instance_type.replace(".", "-")), ("InstanceType", queue.instance_type),
                    ("MinCount", queue.max_nodes if block else 0), ("MaxCount", queue.max_nodes), **notes)
    if it.has_efa:
        resource["Efa"] = _map(("Enabled", True))
    if reservation:
        resource["CapacityReservationTarget"] = _map(("CapacityReservationId", reservation))
    if block:
        resource.yaml_set_comment_before_after_key("CapacityReservationTarget", before=(
            "A Capacity Block brings its own placement: ParallelCluster rejects a placement group and an\n"
            "AllocationStrategy with it, so neither is set."), indent=10)
    elif it.has_efa or reservation:
        # a targeted reservation brings its own placement; a new placement group would fight it
        group = _map(("Enabled", not reservation),
                     Enabled=("off: the capacity reservation decides placement (see above)" if reservation
                              else "one cluster placement group: lowest latency between nodes"))
        resource["Networking"] = _map(("PlacementGroup", group))
        if reservation:
            resource.yaml_set_comment_before_after_key("Networking", before=(
                "A targeted capacity reservation and a placement group conflict: the reserved capacity sits where\n"
                "the reservation put it. If the reservation was made in a cluster placement group, set Enabled:\n"
                "true and Name: <that group>; otherwise keep the placement group off."), indent=10)
    return resource


def _local_storage(it: InstanceType):
    """Root volume room for GPU software, and the NVMe instance store as local scratch, or None."""
    storage = _map()
    if it.accelerator != "none":
        storage["RootVolume"] = _map(("Size", COMPUTE_ROOT_GIB), Size=(
            "GiB: CUDA/Neuron libraries, containers and caches outgrow the AMI's default"))
    if it.instance_store_gb:
        storage["EphemeralVolume"] = _map(("MountDir", SCRATCH), MountDir=(
            f"the {it.instance_store_gb} GB of NVMe instance store (striped): stage data and checkpoints here; "
            "wiped when the node stops"))
    return storage or None


def _prolog_health_check(it: InstanceType) -> bool:
    """ParallelCluster's GPU health check (NVIDIA DCGM's) applies to the queue's accelerator family."""
    accel = family_or_none(it)
    return accel is not None and accel.prolog_health_check


def _queue(spec: ClusterSpec, queue: QueueSpec, it: InstanceType, reservation: str | None, block: bool):
    stack = queue.efa_stack or ("modern" if it.has_efa else "none")
    tags = _seq(_map(("Key", TAG_EFA_STACK), ("Value", stack)))
    if queue.ranks_per_node:
        tags.append(_map(("Key", TAG_RANKS_PER_NODE), ("Value", str(queue.ranks_per_node))))
    entry = _map(("Name", queue.name), ("CapacityType", "CAPACITY_BLOCK" if block else "ONDEMAND"))
    if it.accelerator != "none":
        entry["JobExclusiveAllocation"] = True
        _note(entry, "JobExclusiveAllocation", "one job per node: jobs get every GPU and the whole network")
    entry["Networking"] = _map(("SubnetIds", _seq(spec.compute_subnet)))
    if _several_nics(it):
        entry["Networking"].yaml_set_comment_before_after_key("SubnetIds", before=(
            "a private subnet with a NAT gateway: these nodes get several network interfaces (EFA), and AWS\n"
            "cannot auto-assign a public IP to such instances"), indent=8)
    entry["ComputeResources"] = _seq(_compute_resource(queue, it, reservation, block))
    if storage := _local_storage(it):
        entry["ComputeSettings"] = _map(("LocalStorage", storage))
    if _prolog_health_check(it):
        entry["HealthChecks"] = _map(("Gpu", _map(("Enabled", True), Enabled=(
            "ParallelCluster runs a DCGM GPU check in each job's prolog: a node whose GPUs fail it is drained, "
            "not given the job (its time limits: SlurmSettings/CustomSlurmSettings)"))))
    actions = _map()
    if spec.pyxis_on:
        actions["OnNodeStart"] = _pyxis_action(spec, "compute-node", PYXIS_COMPUTE_SCRIPT)
        _note(actions, "OnNodeStart", "enables pyxis on each node as it starts (srun --container-image)")
    if spec.post_install:
        actions["OnNodeConfigured"] = _map(("Script", spec.post_install))
    if actions:
        entry["CustomActions"] = actions
    if iam := _s3_read_access(spec.pyxis_script, spec.post_install):
        entry["Iam"] = iam
    entry["Tags"] = tags
    entry.yaml_set_comment_before_after_key("Tags", before=(
        f"hpc reads these: {TAG_EFA_STACK} picks the EFA/NCCL environment ({', '.join(EFA_STACKS)})"
        + (f", {TAG_RANKS_PER_NODE} the ranks per CPU node" if queue.ranks_per_node else "")), indent=6)
    return entry


def _shared_storage(fsx: FsxSpec):
    size = fsx_size(fsx)
    sized = (f"sized for --fsx-throughput {fsx.throughput_mbs} MB/s" if fsx.throughput_mbs else
             "edit, or size it with --fsx-throughput MB/s")
    settings = _map(("StorageCapacity", size.capacity_gib), ("DeploymentType", fsx.deployment),
                    StorageCapacity=(f"GiB, 1200 or a multiple of 2400: about {size.baseline_mbs} MB/s baseline "
                                     f"({size.per_unit_mbs} MB/s per TiB); {sized}"))
    if fsx.deployment == "PERSISTENT_2":
        settings["PerUnitStorageThroughput"] = size.per_unit_mbs
        _note(settings, "PerUnitStorageThroughput", "MB/s per TiB: 125, 250, 500 or 1000")
        if fsx.import_path:  # PERSISTENT_2 links S3 only through a data repository association
            settings["DataRepositoryAssociations"] = _seq(_map(
                ("Name", "s3-data"), ("BatchImportMetaDataOnCreate", True),
                ("DataRepositoryPath", fsx.import_path), ("FileSystemPath", "/"),
                ("AutoImportPolicy", _seq("NEW", "CHANGED", "DELETED"))))
    elif fsx.import_path:
        settings["ImportPath"] = fsx.import_path
    settings["DeletionPolicy"] = "Retain"
    _note(settings, "DeletionPolicy", "keep /fsx (checkpoints) when the cluster is deleted; ParallelCluster's "
          "default, Delete, deletes it; delete it yourself when done (it is billed until then)")
    return _map(("Name", "fsx"), ("StorageType", "FsxLustre"), ("MountDir", FSX_MOUNT),
                ("FsxLustreSettings", settings))


def command_line(spec: ClusterSpec, output: str) -> str:
    """The `hpc cluster config` command that makes this spec (written into the file's header)."""
    subnets = (["--subnet", spec.head_subnet] if spec.head_subnet == spec.compute_subnet else
               ["--head-subnet", spec.head_subnet, "--compute-subnet", spec.compute_subnet])
    args = ["hpc", "cluster", "config", "--name", spec.name, "--region", spec.region, *subnets,
            "--key-name", spec.key_name]
    for q in spec.queues:
        options = ([f"efa-stack={q.efa_stack}"] if q.efa_stack else []) + (
            [f"ranks-per-node={q.ranks_per_node}"] if q.ranks_per_node else [])
        args += ["--queue-spec", ",".join([f"{q.name}={q.instance_type}:{q.max_nodes}", *options])]
    args += ["--head-node", spec.head_node, "--os", spec.os]
    if spec.custom_ami:
        args += ["--custom-ami", spec.custom_ami]
    if spec.fsx:
        args += ["--fsx-deployment", spec.fsx.deployment, "--fsx-capacity", str(spec.fsx.capacity_gib)]
        if spec.fsx.throughput_mbs:
            args += ["--fsx-throughput", str(spec.fsx.throughput_mbs)]
        if spec.fsx.import_path:
            args += ["--fsx-import", spec.fsx.import_path]
    if spec.capacity_reservation:
        target = f"{spec.reservation_queue}={spec.capacity_reservation}" if spec.reservation_queue else \
            spec.capacity_reservation
        args += ["--capacity-reservation", target]
    if spec.capacity_block:
        args += ["--capacity-block", f"{spec.capacity_block_queue}={spec.capacity_block}" if spec.capacity_block_queue
                 else spec.capacity_block]
    if spec.post_install:
        args += ["--post-install", spec.post_install]
    if spec.ssh_allowed_ips != SSH_ALLOWED_IPS:
        args += ["--ssh-allowed-ips", spec.ssh_allowed_ips]
    if spec.pyxis_script:
        args += ["--pyxis-script", spec.pyxis_script]
    elif spec.pyxis:
        args.append("--pyxis")
    return shlex.join([*args, "-o", output])


def pyxis_script_text() -> str:
    """The toolkit's script that turns pyxis on (run by --pyxis-script's custom actions)."""
    return (Path(__file__).parent / PYXIS_SCRIPT_NAME).read_text(encoding="utf-8")


def comment_safe(text: str) -> str:
    """Text for one YAML comment line: characters that are not printable (line breaks, \\x85, \\u2028, controls,
    which YAML forbids or a YAML 1.1 reader such as PyYAML takes as a new line) written as \\uXXXX escapes."""
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)


def build_config(spec: ClusterSpec, output: str = "cluster.yaml"):
    """(commented ParallelCluster v3 document, warnings). Raises UsageError / HpcError on bad input,
    including the accelerators' official-AMI traps without a custom AMI (Family.official_ami_trap). The values
    themselves are checked by write_config, with `hpc cluster validate`'s rules."""
    # instance types in the catalog's spelling (flags accept any case)
    spec = dataclasses.replace(spec, head_node=flags.instance_type(spec.head_node, "--head-node").name, queues=tuple(
        dataclasses.replace(q, instance_type=flags.instance_type(
            q.instance_type, "--queue-spec", f"{q.name}={q.instance_type}:{q.max_nodes}").name) for q in spec.queues))
    types = _check_spec(spec)
    reservation_queue = _target_queue("--capacity-reservation", spec.capacity_reservation, spec.reservation_queue,
                                      types)
    block_queue = _target_queue("--capacity-block", spec.capacity_block, spec.capacity_block_queue, types)
    if block_queue and block_queue == reservation_queue:
        raise UsageError(f"queue {block_queue!r} is given both --capacity-reservation and --capacity-block",
                         fix="a queue uses one: a Capacity Block (CAPACITY_BLOCK) or an On-Demand Capacity "
                         "Reservation; name the queue each is for (QUEUE=cr-...)")
    traps = [trap for q in spec.queues if (trap := checks.ami_trap(types[q.name])) is not None]
    warnings = [trap.reminder for trap in traps if trap.reminder]
    if not spec.ssh_allowed_ips.startswith("pl-") and ipaddress.ip_network(spec.ssh_allowed_ips).prefixlen == 0:
        warnings.append(f"--ssh-allowed-ips {spec.ssh_allowed_ips} opens the head node's SSH port to the whole "
                        "internet: give your address (/32), your VPN's range or a prefix list")
    accelerators = sum(types[q.name].gpus * q.max_nodes for q in spec.queues)
    if spec.fsx and not spec.fsx.throughput_mbs and accelerators:
        warnings.append(f"FSx: {fsx_size(spec.fsx).baseline_mbs} MB/s baseline ({spec.fsx.capacity_gib} GiB "
                        f"{spec.fsx.deployment}) shared by up to {accelerators} accelerators reading from /fsx: "
                        "size it for your jobs with --fsx-throughput MB/s")
    image = _map(("Os", spec.os))
    if spec.custom_ami:  # cluster-wide: e.g. the proprietary driver serves every NVIDIA GPU, not only V100
        image["CustomAmi"] = spec.custom_ami
        trapped = {family_or_none(t) for t in types.values() if checks.ami_trap(t) is not None}
        _note(image, "CustomAmi", "edit: your AMI" + "".join(
            accel.custom_ami_note() for accel in FAMILIES.values() if accel in trapped))
    shared = spec.head_subnet == spec.compute_subnet
    head = _map(("InstanceType", spec.head_node),
                ("Networking", _map(("SubnetId", spec.head_subnet), SubnetId=(
                    "edit: one subnet for every node: private, with a NAT gateway (reach the head node through "
                    "SSM or a bastion)" if shared and any(_several_nics(t) for t in types.values())
                    else "edit: the head node's subnet (public for SSH, or private)"))),
                ("Ssh", _map(("KeyName", spec.key_name), ("AllowedIps", spec.ssh_allowed_ips),
                             KeyName="edit: your EC2 key pair", AllowedIps=(
                                 "edit: who may SSH in (a CIDR such as your address/32, or a prefix list pl-...)"
                                 + ("" if spec.ssh_allowed_ips != SSH_ALLOWED_IPS else
                                    "; this default admits private 10.x addresses only (a bastion or VPN in the "
                                    "VPC), not ParallelCluster's 0.0.0.0/0")))),
                ("LocalStorage", _map(("RootVolume", _map(("Size", HEAD_ROOT_GIB), Size=(
                    "GiB: Slurm state, logs and software built on the head node outgrow the AMI's 40"))))))
    if spec.pyxis_on:
        action = _pyxis_action(spec, "head-node", PYXIS_HEAD_SCRIPT)
        _note(action, "Script", "enables pyxis on the head node (srun --container-image; off by default since "
              "ParallelCluster 3.11)" + ("" if spec.pyxis_script else f"; pinned to commit {PYXIS_COMMIT[:12]}"))
        head["CustomActions"] = _map(("OnNodeConfigured", action))
        if iam := _s3_read_access(spec.pyxis_script):
            head["Iam"] = iam

    def reservation_of(q: QueueSpec) -> str | None:
        return spec.capacity_reservation if q.name == reservation_queue else \
            spec.capacity_block if q.name == block_queue else None
    queues = _seq(*(_queue(spec, q, types[q.name], reservation_of(q), q.name == block_queue)
                    for q in spec.queues))
    accelerated = any(t.accelerator != "none" for t in types.values())
    slurm = _map(("ScaledownIdletime", IDLE_MINUTES_ACCELERATED if accelerated else IDLE_MINUTES),
                 ScaledownIdletime=("minutes an idle dynamic node stays up: GPU nodes take minutes to boot, so "
                                    "keep them between jobs" if accelerated else "minutes an idle dynamic node "
                                    "stays up (ParallelCluster's default)"))
    if any(_prolog_health_check(t) for t in types.values()):  # the queues with the GPU health check (_queue)
        slurm["CustomSlurmSettings"] = _seq(
            _map(("BatchStartTimeout", BATCH_START_TIMEOUT_S), BatchStartTimeout=(
                "s: room for the GPU check in the prolog (ParallelCluster's 180 can fail p4d/p5 jobs, "
                "aws-parallelcluster#6777)")),
            _map(("PrologEpilogTimeout", PROLOG_TIMEOUT_S), PrologEpilogTimeout=(
                "s: a hung prolog is killed, its job requeued and the node drained (Slurm waits forever "
                "by default); ParallelCluster stops its check at 600")))
    doc = _map(("Region", spec.region), ("Image", image), ("HeadNode", head),
               ("Scheduling", _map(("Scheduler", "slurm"), ("SlurmSettings", slurm), ("SlurmQueues", queues))))
    if spec.fsx:
        doc["SharedStorage"] = _seq(_shared_storage(spec.fsx))
    doc.yaml_set_start_comment("\n".join([
        f"ParallelCluster v3 config for cluster {spec.name!r}, made by:",
        f"  {comment_safe(command_line(spec, output))}",
        "Check it offline:  hpc cluster validate " + output,
        f"Create it:         pcluster create-cluster --cluster-name {spec.name} --cluster-configuration {output}",
    ]))
    if warnings:
        doc.yaml_set_comment_before_after_key("Image", before="\n".join(textwrap.wrap(warnings[0], 110)), indent=0)
    return doc, warnings


def render(doc) -> str:
    """The document as YAML text: same document, same bytes."""
    import io

    yaml = _ruamel().YAML()
    yaml.width = 4096  # never fold long values (URLs, ids)
    yaml.indent(mapping=2, sequence=4, offset=2)
    out = io.StringIO()
    yaml.dump(_quote_unprintable(doc), out)
    return out.getvalue()


def _quote_unprintable(node):
    """Strings with characters that are not printable (\\x85, \\u2028, controls) go double-quoted, where they are
    escaped: in ruamel's plain or single-quoted style a \\x85 is folded and reads back as a space."""
    scalars = _ruamel().scalarstring
    if isinstance(node, dict):
        for key, value in node.items():
            node[key] = _quote_unprintable(value)
    elif isinstance(node, list):
        node[:] = [_quote_unprintable(value) for value in node]
    elif isinstance(node, str) and not node.isprintable():
        return scalars.DoubleQuotedScalarString(node)
    return node


def _validated(text: str, path: str, known: list[str]) -> list[str]:
    """`hpc cluster validate`'s rules on the config about to be written: an error stops (nothing is written);
    its warnings are returned (less those already given)."""
    from toolkit.cluster.validate import validate_text

    report = validate_text(text, path)
    errors = [f for f in report.findings if f.level == "error"]
    if errors:
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise HpcError(f"the config these options make is not valid, so nothing was written: {first.path}: "
                       f"{first.message}{more}", fix=first.fix or "check the option that sets that key")
    return [f"{f.path}: {f.message}" for f in report.findings if f.level == "warning" and f.message not in known]


def config_text(spec: ClusterSpec, output: str) -> tuple[str, list[str]]:
    """The validated config text (its header names `output`) and its warnings; nothing written."""
    doc, warnings = build_config(spec, output=output)
    # subnet ids as flag values (queue add/set check theirs alike); build_config itself writes any text faithfully
    for option, subnet in (("--head-subnet", spec.head_subnet), ("--compute-subnet", spec.compute_subnet)):
        flags.subnet_id(subnet, "--subnet" if spec.head_subnet == spec.compute_subnet else option)
    text = render(doc)
    return text, warnings + _validated(text, output, warnings)


def write_config(spec: ClusterSpec, path: str | Path, force: bool = False) -> list[str]:
    """Write the config to `path` (never over an existing file unless force); returns the warnings."""
    path = Path(path)
    refuse_overwrite(path, force)
    text, warnings = config_text(spec, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return warnings
