"""The toolkit's own checks on a ParallelCluster config dict: the traps pcluster cannot see offline.

- the V100 trap: ParallelCluster >= 3.9 official AMIs carry NVIDIA's open (OpenRM) kernel driver, which does
  not support V100 (p3, p3dn); pcluster's own check needs AWS (DescribeImages), so we catch it from the catalog
- ImportPath / ExportPath / AutoImportPolicy on a PERSISTENT_2 FSx (it links S3 only through
  DataRepositoryAssociations)
- a placement group together with a targeted capacity reservation
- instance types the catalog does not know (offline validation needs their facts)
The config generator uses the same messages, so `hpc cluster config` and `hpc cluster validate` agree.
"""

from __future__ import annotations

from typing import Any, Iterator

from toolkit.catalog import catalog
from toolkit.cluster.findings import Finding

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
PG_RESERVATION = (
    "a placement group together with a targeted capacity reservation: the reserved capacity sits where the "
    "reservation put it, so instances asked for inside another placement group can fail with "
    "InsufficientInstanceCapacity although the reservation has room"
)
PG_RESERVATION_FIX = (
    "set Networking/PlacementGroup/Enabled: false on this compute resource (the reservation brings its own "
    "placement), or name the cluster placement group the reservation was created in"
)


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _named(items: Any) -> Iterator[tuple[str, dict]]:
    """(label, item) for the mappings of a list; the label is the item's Name, else its index."""
    for index, item in enumerate(items if isinstance(items, list) else []):
        if isinstance(item, dict):
            yield str(item.get("Name") or index), item


def compute_resources(config: dict) -> Iterator[tuple[str, dict, dict]]:
    """(key path, queue, compute resource) for every compute resource of every Slurm queue."""
    for qname, queue in _named(_dict(config.get("Scheduling")).get("SlurmQueues")):
        for crname, resource in _named(queue.get("ComputeResources")):
            yield f"Scheduling/SlurmQueues[{qname}]/ComputeResources[{crname}]", queue, resource


def queue_instance_types(config: dict) -> Iterator[tuple[str, dict, str]]:
    """(key path, queue, instance type) for every compute resource (InstanceType or Instances list)."""
    for path, queue, resource in compute_resources(config):
        if isinstance(resource.get("InstanceType"), str):
            yield f"{path}/InstanceType", queue, resource["InstanceType"]
        for index, entry in enumerate(resource.get("Instances") or []):
            if isinstance(entry, dict) and isinstance(entry.get("InstanceType"), str):
                yield f"{path}/Instances[{index}]/InstanceType", queue, entry["InstanceType"]


def instance_types(config: dict) -> Iterator[tuple[str, str]]:
    """(key path, instance type) for the head node and every compute resource."""
    head = _dict(config.get("HeadNode")).get("InstanceType")
    if isinstance(head, str):
        yield "HeadNode/InstanceType", head
    for path, _, itype in queue_instance_types(config):
        yield path, itype


def unknown_instance_types(config: dict) -> list[Finding]:
    known = catalog()
    return [
        Finding("error", path, f"instance type {itype!r} is not in the toolkit's catalog: offline validation "
                f"needs its facts (GPUs, vCPUs, EFA) and pcluster's instance checks were not run",
                f"use one of: {', '.join(sorted(known))}; or add its public facts to toolkit/catalog.yaml")
        for path, itype in instance_types(config) if itype not in known
    ]


def custom_ami(config: dict, queue: dict) -> str | None:
    return _dict(queue.get("Image")).get("CustomAmi") or _dict(config.get("Image")).get("CustomAmi")


def v100_trap(config: dict) -> list[Finding]:
    found = []
    for path, queue, itype in queue_instance_types(config):
        if itype not in catalog() or not catalog()[itype].proprietary_driver:
            continue
        if custom_ami(config, queue):
            found.append(Finding("warning", path, V100_REMINDER.format(itype=itype)))
        else:
            found.append(Finding("error", path, V100_TRAP.format(itype=itype), V100_FIX))
    return found


def fsx_persistent2_s3_link(config: dict) -> list[Finding]:
    found = []
    for name, storage in _named(config.get("SharedStorage")):
        settings = _dict(storage.get("FsxLustreSettings"))
        if settings.get("DeploymentType") != "PERSISTENT_2":
            continue
        for key in ("ImportPath", "ExportPath", "AutoImportPolicy", "ImportedFileChunkSize"):
            if key in settings:
                found.append(Finding(
                    "error", f"SharedStorage[{name}]/FsxLustreSettings/{key}",
                    f"{key} is not allowed with DeploymentType PERSISTENT_2: FSx links S3 to a PERSISTENT_2 file "
                    "system only through data repository associations",
                    "remove it and add FsxLustreSettings/DataRepositoryAssociations: [{Name, DataRepositoryPath: "
                    "s3://bucket/prefix, FileSystemPath: /prefix}] (or use SCRATCH_2 to keep ImportPath)"))
    return found


def gdr_without_efa(config: dict) -> list[Finding]:
    """pcluster checks this only on InstanceType compute resources, not on an Instances list."""
    return [
        Finding("error", f"{path}/Efa/GdrSupport", "GdrSupport is set but EFA is not enabled",
                "remove GdrSupport (it has had no effect since ParallelCluster 3.0.2), and set Efa/Enabled: true "
                "if the instance type has EFA")
        for path, _, resource in compute_resources(config)
        if "Instances" in resource and _dict(resource.get("Efa")).get("GdrSupport")
        and not _dict(resource.get("Efa")).get("Enabled")
    ]


def placement_group_with_reservation(config: dict) -> list[Finding]:
    found = []
    for path, queue, resource in compute_resources(config):
        target = _dict(resource.get("CapacityReservationTarget")) or _dict(queue.get("CapacityReservationTarget"))
        if not target.get("CapacityReservationId"):
            continue  # resource groups and open reservations can hold placement-group reservations
        own = _dict(_dict(resource.get("Networking")).get("PlacementGroup"))
        group, where = (own, f"{path}/Networking/PlacementGroup") if own else (
            _dict(_dict(queue.get("Networking")).get("PlacementGroup")),
            path.rsplit("/ComputeResources", 1)[0] + "/Networking/PlacementGroup")
        enabled = group.get("Enabled", bool(group.get("Name") or group.get("Id")))
        if enabled:
            named = group.get("Name") or group.get("Id")
            found.append(Finding(
                "warning", where,
                PG_RESERVATION + (f" (fine only if {named!r} is the group the reservation was created in)"
                                  if named else " (ParallelCluster would create a new, unrelated group)"),
                PG_RESERVATION_FIX))
    return found


def check(config: dict) -> list[Finding]:
    """All of the toolkit's own checks, in a stable order."""
    return (unknown_instance_types(config) + v100_trap(config) + fsx_persistent2_s3_link(config)
            + gdr_without_efa(config) + placement_group_with_reservation(config))
