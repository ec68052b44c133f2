"""The toolkit's own checks on a ParallelCluster config dict: the traps pcluster cannot see offline.

- the official-AMI traps, each accelerator family's (toolkit.accelerators: Family.official_ami_trap), e.g. V100:
  ParallelCluster >= 3.9 official AMIs carry NVIDIA's open (OpenRM) kernel driver, which does not support V100
  (p3, p3dn); pcluster's own check needs AWS (DescribeImages), so we catch it from the catalog
- a CAPACITY_BLOCK queue without its reservation id (pcluster's check of it needs AWS)
- ImportPath / ExportPath / AutoImportPolicy on a PERSISTENT_2 FSx (it links S3 only through
  DataRepositoryAssociations)
- a placement group together with a targeted capacity reservation
- instance types the catalog does not know (a warning: the checks that need their facts are limited)
- a custom action script fetched from a branch of a Git host (a warning: it runs as root on every node, and a
  moved or changed file there changes or breaks the nodes' bootstrap; a commit or S3 holds still)
The config generator uses the same messages, so `hpc cluster config` and `hpc cluster validate` agree.
"""

from __future__ import annotations

import re
from typing import Any, Iterator

from toolkit.accelerators import family_or_none
from toolkit.accelerators.base import AmiTrap
from toolkit.catalog import InstanceType, catalog, ec2_type_names, facts_hint, suggestion
from toolkit.cluster.findings import Finding

CAPACITY_BLOCK_NO_ID = (
    "CapacityType CAPACITY_BLOCK needs the Capacity Block's reservation id: ParallelCluster launches the nodes "
    "into that reservation only"
)
CAPACITY_BLOCK_NO_ID_FIX = (
    "add CapacityReservationTarget/CapacityReservationId: cr-... (the id of the Capacity Block you bought) to the "
    "compute resource"
)
PG_RESERVATION = (
    "a placement group together with a targeted capacity reservation: the reserved capacity sits where the "
    "reservation put it, so instances asked for inside another placement group can fail with "
    "InsufficientInstanceCapacity although the reservation has room"
)
PG_RESERVATION_FIX = (
    "set Networking/PlacementGroup/Enabled: false on this {level} (the reservation brings its own "
    "placement), or name the cluster placement group the reservation was created in"
)


# A script URL on a Git host, and the ref it names: raw.githubusercontent.com/OWNER/REPO/REF/PATH (REF may be
# refs/heads/BRANCH or refs/tags/TAG), github.com/OWNER/REPO/raw/REF/PATH, gitlab.com/GROUP/REPO/-/raw/REF/PATH.
GIT_HOST_SCRIPT = re.compile(
    r"https?://(?:raw\.githubusercontent\.com/[^/]+/[^/]+/|github\.com/[^/]+/[^/]+/(?:raw|blob)/|"
    r"gitlab\.com/(?:[^/]+/)+-/raw/)(?P<ref>refs/(?:heads|tags)/[^/]+|[^/]+)/")
COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
CUSTOM_ACTION_EVENTS = ("OnNodeStart", "OnNodeConfigured", "OnNodeUpdated")


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


def _unknown_type(itype: str) -> tuple[str, str]:
    """(what the name is, the fix) for a type outside the catalog: a real EC2 type (botocore's list) lacking facts,
    or a name EC2 does not have (a typo: the closest real one)."""
    limited = ("pcluster's checks that need its facts (EFA, GPUs, memory, network interfaces and public IPs, "
               "architecture, placement groups) were not run for it, nor the toolkit's V100 check")
    if itype in ec2_type_names():
        return (f"instance type {itype!r} is a real EC2 type the toolkit's catalog lacks: its vCPUs, cores, memory "
                f"and EFA are unknown here, so {limited}; jobs planned on it need them",
                f"{facts_hint()}, to check them offline; `pcluster create-cluster` checks them against AWS")
    guess = suggestion(itype)
    listed = "the toolkit's catalog" + (" nor among EC2's instance types (botocore's list)" if ec2_type_names() else "")
    return (f"instance type {itype!r} is not in {listed}: {limited}",
            (f"did you mean {guess}? " if guess else "") + f"if {itype} is a real type, {facts_hint()}, to check "
            "them offline; `pcluster create-cluster` checks them against AWS")


def unknown_instance_types(config: dict) -> list[Finding]:
    """A type outside the catalog is a hole in our data, not a fault in the file: a warning naming the checks
    that are limited for it."""
    return [Finding("warning", path, *_unknown_type(itype)) for path, itype in instance_types(config)
            if itype not in catalog()]


def custom_ami(config: dict, queue: dict) -> str | None:
    return _dict(queue.get("Image")).get("CustomAmi") or _dict(config.get("Image")).get("CustomAmi")


def official_ami_traps(config: dict) -> list[Finding]:
    """Accelerators the official AMIs cannot drive (Family.official_ami_trap): an error without a custom AMI, the
    family's reminder (if any) with one."""
    found = []
    for path, queue, itype in queue_instance_types(config):
        it = catalog().get(itype)
        trap = ami_trap(it) if it is not None else None
        if trap is None:
            continue
        if not custom_ami(config, queue):
            found.append(Finding("error", path, trap.trap, trap.fix))
        elif trap.reminder:
            found.append(Finding("warning", path, trap.reminder))
    return found


def ami_trap(it: InstanceType) -> AmiTrap | None:
    """Why the official AMIs cannot run `it`'s accelerators, or None (a type without a family has no trap here)."""
    accel = family_or_none(it)
    return accel.official_ami_trap(it) if accel is not None else None


def capacity_block_rules(config: dict) -> list[Finding]:
    """The Capacity Block rules pcluster cannot see offline or checks only on Instances lists: the reservation
    id (its check needs AWS) and an AllocationStrategy on a queue of InstanceType compute resources."""
    found = []
    for path, queue, resource in compute_resources(config):
        if queue.get("CapacityType") != "CAPACITY_BLOCK":
            continue
        target = _dict(resource.get("CapacityReservationTarget")) or _dict(queue.get("CapacityReservationTarget"))
        if not target.get("CapacityReservationId"):
            found.append(Finding("error", f"{path}/CapacityReservationTarget", CAPACITY_BLOCK_NO_ID,
                                 CAPACITY_BLOCK_NO_ID_FIX))
        if "AllocationStrategy" in queue and "Instances" not in resource:
            found.append(Finding(
                "error", path.rsplit("/ComputeResources", 1)[0] + "/AllocationStrategy",
                "AllocationStrategy is set on a CAPACITY_BLOCK queue: ParallelCluster launches Capacity Block nodes "
                "without one (its own check covers only Instances lists)", "remove AllocationStrategy from the queue"))
    return list({(f.path, f.message): f for f in found}.values())


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
                PG_RESERVATION_FIX.format(level="compute resource" if own else "queue")))
    return found


def custom_action_scripts(config: dict) -> Iterator[tuple[str, str]]:
    """(key path, script URL) of every custom action: the head node's and each queue's, one Script or a
    Sequence of them."""
    sections = [("HeadNode", _dict(config.get("HeadNode")))] + [
        (f"Scheduling/SlurmQueues[{name}]", queue)
        for name, queue in _named(_dict(config.get("Scheduling")).get("SlurmQueues"))]
    for where, section in sections:
        actions = _dict(section.get("CustomActions"))
        for event in CUSTOM_ACTION_EVENTS:
            action = _dict(actions.get(event))
            if isinstance(action.get("Script"), str):
                yield f"{where}/CustomActions/{event}/Script", action["Script"]
            for index, step in enumerate(action.get("Sequence") or []):
                if isinstance(step, dict) and isinstance(step.get("Script"), str):
                    yield f"{where}/CustomActions/{event}/Sequence[{index}]/Script", step["Script"]


def unpinned_scripts(config: dict) -> list[Finding]:
    """A custom action fetched from a branch of a Git host runs whatever that branch holds when each node
    boots, as root; the file moving makes the action fail, and the cluster CREATE_FAILED. A full commit id or a
    tag (refs/tags/...) in the URL holds still, as does the admin's own S3 copy."""
    found = []
    for path, url in custom_action_scripts(config):
        match = GIT_HOST_SCRIPT.match(url.strip())
        if not match or COMMIT.fullmatch(match["ref"]) or match["ref"].startswith("refs/tags/"):
            continue
        found.append(Finding(
            "warning", path,
            f"{url} names the branch (or ref) {match['ref']!r}, not a commit: the script runs as root on every node "
            "as that branch holds it when the node boots, and if the file moves the action fails and the cluster "
            "ends CREATE_FAILED (or nodes fail to start)",
            f"pin it: put the full 40-hex commit id in place of {match['ref']!r} (a commit where the file exists), "
            "or upload your reviewed copy to your S3 bucket and give its s3:// URL (with Iam/S3Access for the "
            "bucket; for pyxis: hpc cluster pyxis-script, then hpc cluster config --pyxis-script s3://...)"))
    return found


def check(config: dict) -> list[Finding]:
    """All of the toolkit's own checks, in a stable order."""
    return (unknown_instance_types(config) + official_ami_traps(config) + capacity_block_rules(config)
            + fsx_persistent2_s3_link(config)
            + gdr_without_efa(config) + placement_group_with_reservation(config) + unpinned_scripts(config))
