"""`hpc cluster config`: queues and options -> a ParallelCluster v3 config, emitted by a YAML serializer.

ClusterSpec (what the admin asked for) -> build_config() -> a commented YAML document -> render() -> text.
The same spec always gives the same bytes; comments mark what a human edits (key pair, subnet, node counts,
AMI, FSx size) and explain the traps (V100 driver, reservations and placement groups).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import textwrap
from pathlib import Path
from typing import Any, Literal

from toolkit.catalog import InstanceType, instance
from toolkit.cluster import checks
from toolkit.cluster.queues import EFA_STACKS, TAG_EFA_STACK, TAG_RANKS_PER_NODE
from toolkit.errors import HpcError, UsageError

FsxDeployment = Literal["SCRATCH_2", "PERSISTENT_2"]
FSX_DEPLOYMENTS = ("SCRATCH_2", "PERSISTENT_2")
OSES = ("alinux2023", "ubuntu2204", "ubuntu2404", "rhel8", "rocky8", "rhel9", "rocky9")  # pcluster 3.16
QUEUE_NAME = re.compile(r"^[a-z][a-z0-9-]{0,24}$")  # pcluster: lower case, digits, '-', at most 25
CLUSTER_NAME = re.compile(r"^[a-zA-Z][a-zA-Z0-9-]{0,59}$")
REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")
RESERVATION = re.compile(r"^cr-[0-9a-f]{8,17}$")
FSX_MOUNT = "/fsx"
PERSISTENT_2_THROUGHPUT = 125  # MB/s/TiB, the smallest PERSISTENT_2 tier
INSTALL_FIX = "pip install 'hpc-toolkit[admin]'"


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
    capacity_gib: int = 1200
    import_path: str | None = None  # s3://bucket/prefix


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    name: str
    region: str
    subnet: str
    key_name: str
    queues: tuple[QueueSpec, ...]
    head_node: str = "c5n.18xlarge"
    os: str = "ubuntu2204"
    custom_ami: str | None = None
    fsx: FsxSpec | None = None
    capacity_reservation: str | None = None
    reservation_queue: str | None = None  # which queue uses it (default: the only accelerator queue)
    post_install: str | None = None


def parse_queue(text: str) -> QueueSpec:
    """`NAME=INSTANCE_TYPE:MAX_NODES[,efa-stack=modern|legacy|none][,ranks-per-node=N]` -> QueueSpec."""
    usage = "write --queue NAME=INSTANCE_TYPE:MAX_NODES, e.g. --queue p3dn=p3dn.24xlarge:4"
    head, *options = text.split(",")
    match = re.fullmatch(r"([^=]+)=([^:]+):(\d+)", head.strip())
    if not match:
        raise UsageError(f"--queue {text!r} is not NAME=INSTANCE_TYPE:MAX_NODES", fix=usage)
    name, itype, max_nodes = match.group(1), match.group(2), int(match.group(3))
    extra: dict[str, Any] = {}
    for option in options:
        key, _, value = option.partition("=")
        if key == "efa-stack" and value in EFA_STACKS:
            extra["efa_stack"] = value
        elif key == "ranks-per-node" and value.isdigit() and int(value) > 0:
            extra["ranks_per_node"] = int(value)
        else:
            raise UsageError(f"--queue {text!r}: unknown option {option!r}",
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
        raise UsageError("no --queue given", fix="add --queue NAME=INSTANCE_TYPE:MAX_NODES")
    names = [q.name for q in spec.queues]
    for queue in spec.queues:
        if not QUEUE_NAME.match(queue.name):
            raise UsageError(f"queue name {queue.name!r} is not allowed by ParallelCluster",
                             fix="start with a lower-case letter; lower-case letters, digits and '-'; at most 25")
        if names.count(queue.name) > 1:
            raise UsageError(f"queue {queue.name!r} is given twice", fix="give every queue its own name")
        if queue.max_nodes < 1:
            raise UsageError(f"queue {queue.name!r}: MAX_NODES must be at least 1", fix="e.g. p3dn=p3dn.24xlarge:4")
    if spec.fsx:
        _check_fsx(spec.fsx)
    if spec.capacity_reservation and not RESERVATION.match(spec.capacity_reservation):
        raise UsageError(f"--capacity-reservation {spec.capacity_reservation!r} is not a reservation id",
                         fix="give the id of a targeted On-Demand Capacity Reservation, e.g. cr-0123456789abcdef0")
    types = {q.name: instance(q.instance_type) for q in spec.queues}
    instance(spec.head_node)
    for queue in spec.queues:
        if queue.ranks_per_node and types[queue.name].accelerator != "none":
            raise UsageError(f"queue {queue.name!r}: ranks-per-node is for CPU queues",
                             fix="GPU and Gaudi queues run one rank per accelerator: drop ranks-per-node")
        if types[queue.name].proprietary_driver and not spec.custom_ami:
            raise HpcError(checks.V100_TRAP.format(itype=queue.instance_type), fix=checks.V100_FIX.replace(
                "(Image/CustomAmi or the queue's Image/CustomAmi)", "(pass it as --custom-ami AMI_ID)"))
    return types


def _check_fsx(fsx: FsxSpec) -> None:
    if fsx.deployment not in FSX_DEPLOYMENTS:
        raise UsageError(f"--fsx-deployment {fsx.deployment!r} is not supported",
                         fix=f"use one of: {', '.join(FSX_DEPLOYMENTS)}")
    if not (fsx.capacity_gib == 1200 or (fsx.capacity_gib > 0 and fsx.capacity_gib % 2400 == 0)):
        raise UsageError(f"--fsx-capacity {fsx.capacity_gib}: FSx for Lustre {fsx.deployment} takes 1200 GiB or "
                         "a multiple of 2400 GiB", fix="e.g. --fsx-capacity 1200 or 2400")
    if fsx.import_path and not re.match(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$", fsx.import_path):
        raise UsageError(f"--fsx-import {fsx.import_path!r} is not an S3 URL", fix="e.g. s3://my-bucket/prefix")


def _reservation_queue(spec: ClusterSpec, types: dict[str, InstanceType]) -> str | None:
    if not spec.capacity_reservation:
        return None
    if spec.reservation_queue:
        if spec.reservation_queue not in types:
            raise UsageError(f"--capacity-reservation names queue {spec.reservation_queue!r}, which is not given",
                             fix=f"use one of: {', '.join(types)}")
        return spec.reservation_queue
    accelerated = [name for name, it in types.items() if it.accelerator != "none"]
    if len(types) == 1 or len(accelerated) == 1:
        return next(iter(types)) if len(types) == 1 else accelerated[0]
    raise UsageError("--capacity-reservation: more than one queue could use it",
                     fix="write --capacity-reservation QUEUE=cr-...")


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


def _bucket(url: str) -> str | None:
    return url[len("s3://"):].split("/")[0] if url.startswith("s3://") else None


def _compute_resource(queue: QueueSpec, it: InstanceType, reservation: str | None):
    resource = _map(("Name", queue.instance_type.replace(".", "-")), ("InstanceType", queue.instance_type),
                    ("MinCount", 0), ("MaxCount", queue.max_nodes),
                    MinCount="0: nodes start on demand and stop when idle",
                    MaxCount="edit: most nodes a job can get")
    if it.has_efa:
        resource["Efa"] = _map(("Enabled", True))
    if reservation:
        resource["CapacityReservationTarget"] = _map(("CapacityReservationId", reservation))
    if it.has_efa or reservation:
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


def _queue(spec: ClusterSpec, queue: QueueSpec, it: InstanceType, reservation: str | None):
    stack = queue.efa_stack or ("modern" if it.has_efa else "none")
    tags = _seq(_map(("Key", TAG_EFA_STACK), ("Value", stack)))
    if queue.ranks_per_node:
        tags.append(_map(("Key", TAG_RANKS_PER_NODE), ("Value", str(queue.ranks_per_node))))
    entry = _map(("Name", queue.name), ("CapacityType", "ONDEMAND"))
    if it.accelerator != "none":
        entry["JobExclusiveAllocation"] = True
        _note(entry, "JobExclusiveAllocation", "one job per node: jobs get every GPU and the whole network")
    entry["Networking"] = _map(("SubnetIds", _seq(spec.subnet)))
    entry["ComputeResources"] = _seq(_compute_resource(queue, it, reservation))
    if spec.post_install:
        entry["CustomActions"] = _map(("OnNodeConfigured", _map(("Script", spec.post_install))))
        if bucket := _bucket(spec.post_install):
            entry["Iam"] = _map(("S3Access", _seq(_map(("BucketName", bucket), ("EnableWriteAccess", False)))))
    entry["Tags"] = tags
    entry.yaml_set_comment_before_after_key("Tags", before=(
        f"hpc reads these: {TAG_EFA_STACK} picks the EFA/NCCL environment ({', '.join(EFA_STACKS)})"
        + (f", {TAG_RANKS_PER_NODE} the ranks per CPU node" if queue.ranks_per_node else "")), indent=6)
    return entry


def _shared_storage(fsx: FsxSpec):
    settings = _map(("StorageCapacity", fsx.capacity_gib), ("DeploymentType", fsx.deployment),
                    StorageCapacity="edit: GiB, 1200 or a multiple of 2400")
    if fsx.deployment == "PERSISTENT_2":
        settings["PerUnitStorageThroughput"] = PERSISTENT_2_THROUGHPUT
        _note(settings, "PerUnitStorageThroughput", "MB/s per TiB: 125, 250, 500 or 1000")
        if fsx.import_path:  # PERSISTENT_2 links S3 only through a data repository association
            settings["DataRepositoryAssociations"] = _seq(_map(
                ("Name", "s3-data"), ("BatchImportMetaDataOnCreate", True),
                ("DataRepositoryPath", fsx.import_path), ("FileSystemPath", "/"),
                ("AutoImportPolicy", _seq("NEW", "CHANGED", "DELETED"))))
    elif fsx.import_path:
        settings["ImportPath"] = fsx.import_path
    return _map(("Name", "fsx"), ("StorageType", "FsxLustre"), ("MountDir", FSX_MOUNT),
                ("FsxLustreSettings", settings))


def command_line(spec: ClusterSpec, output: str) -> str:
    """The `hpc cluster config` command that makes this spec (written into the file's header)."""
    args = ["hpc", "cluster", "config", "--name", spec.name, "--region", spec.region, "--subnet", spec.subnet,
            "--key-name", spec.key_name]
    for q in spec.queues:
        options = ([f"efa-stack={q.efa_stack}"] if q.efa_stack else []) + (
            [f"ranks-per-node={q.ranks_per_node}"] if q.ranks_per_node else [])
        args += ["--queue", ",".join([f"{q.name}={q.instance_type}:{q.max_nodes}", *options])]
    args += ["--head-node", spec.head_node, "--os", spec.os]
    if spec.custom_ami:
        args += ["--custom-ami", spec.custom_ami]
    if spec.fsx:
        args += ["--fsx-deployment", spec.fsx.deployment, "--fsx-capacity", str(spec.fsx.capacity_gib)]
        if spec.fsx.import_path:
            args += ["--fsx-import", spec.fsx.import_path]
    if spec.capacity_reservation:
        target = f"{spec.reservation_queue}={spec.capacity_reservation}" if spec.reservation_queue else \
            spec.capacity_reservation
        args += ["--capacity-reservation", target]
    if spec.post_install:
        args += ["--post-install", spec.post_install]
    return shlex.join([*args, "-o", output])


def comment_safe(text: str) -> str:
    """Text for one YAML comment line: characters that are not printable (line breaks, \\x85, \\u2028, controls,
    which YAML forbids or a YAML 1.1 reader such as PyYAML takes as a new line) written as \\uXXXX escapes."""
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)


def build_config(spec: ClusterSpec, output: str = "cluster.yaml"):
    """(commented ParallelCluster v3 document, warnings). Raises UsageError / HpcError on bad input,
    including the V100 trap without a custom AMI."""
    types = _check_spec(spec)
    reservation_queue = _reservation_queue(spec, types)
    warnings = [checks.V100_REMINDER.format(itype=q.instance_type) for q in spec.queues
                if types[q.name].proprietary_driver]
    image = _map(("Os", spec.os))
    if spec.custom_ami:  # cluster-wide: the proprietary driver serves every NVIDIA GPU, not only V100
        image["CustomAmi"] = spec.custom_ami
        _note(image, "CustomAmi", "edit: your AMI" + (" with NVIDIA's proprietary driver" if warnings else ""))
    head = _map(("InstanceType", spec.head_node),
                ("Networking", _map(("SubnetId", spec.subnet), SubnetId="edit: your subnet")),
                ("Ssh", _map(("KeyName", spec.key_name), KeyName="edit: your EC2 key pair")))
    queues = _seq(*(_queue(spec, q, types[q.name], spec.capacity_reservation if q.name == reservation_queue
                           else None) for q in spec.queues))
    doc = _map(("Region", spec.region), ("Image", image), ("HeadNode", head),
               ("Scheduling", _map(("Scheduler", "slurm"), ("SlurmQueues", queues))))
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


def write_config(spec: ClusterSpec, path: str | Path, force: bool = False) -> list[str]:
    """Write the config to `path` (never over an existing file unless force); returns the warnings."""
    path = Path(path)
    if path.exists() and not force:
        raise HpcError(f"{path} already exists", fix="pass --force to overwrite it, or choose another -o FILE")
    doc, warnings = build_config(spec, output=str(path))
    text = render(doc)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return warnings
