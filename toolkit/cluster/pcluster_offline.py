"""aws-parallelcluster's own schema and semantic validators, run offline.

Everything that touches pcluster internals (pinned: aws-parallelcluster 3.16.1) lives here:
- instance facts come from our catalog through pcluster's own hook (Ec2Client.additional_instance_types_data,
  the same one DevSettings/InstanceTypesData feeds), in DescribeInstanceTypes' shape;
- no boto3 client is ever created: pcluster's client wrappers get a stand-in whose every call raises
  OfflineAccessError at once, so nothing resolves credentials, asks the instance-metadata endpoint or opens
  a socket; the validators that need AWS are suppressed and reported as "not checked offline";
- subnets we know nothing about get a fallback availability zone and are taken as private (whether a subnet
  maps public IPs is asked again with every subnet public, to report the multi-NIC risk); the supported-regions
  list comes from the package's own resource file; the official AMI (looked up on AWS) gets a placeholder id;
  existing FSx volumes get stand-in descriptions (what they are is listed as not checked);
- an instance type outside our catalog gets stand-in facts, and the findings of the validators that read
  them are dropped for it (listed as not checked);
- a validator that crashes is reported as failing to run, with its input, not as a finding about the config.
Each pcluster result is tagged with the resource and validator that produced it, to name its key path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from typing import Any, Iterator

from pcluster.aws.common import AWSClientError

from toolkit.accelerators import family_or_none
from toolkit.catalog import catalog

# Validators that ask AWS (EC2, S3, IAM, KMS, FSx, EFS, Route 53, Secrets Manager, a URL) -> what they check.
NEEDS_AWS = {
    "AmiOsCompatibleValidator": "the custom AMI's operating system",
    "CapacityBlockHealthStatusValidator": "capacity block health",
    "CapacityReservationResourceGroupValidator": "the capacity reservation resource group",
    "CapacityReservationSizeValidator": "capacity reservation sizes",
    "CapacityReservationValidator": "the capacity reservation's instance type, zone and state",
    "CapacityTypeValidator": "that the instance type offers the capacity type",
    "ComputeResourceLaunchTemplateValidator": "a dry-run launch of the compute nodes",
    "CustomAmiTagValidator": "the custom AMI's tags",
    "EbsVolumeSizeSnapshotValidator": "the EBS snapshot",
    "EfaSecurityGroupValidator": "the security groups' EFA rules",
    "EfsIdValidator": "the EFS file system",
    "ElasticIpValidator": "the Elastic IP",
    "ExistingFsxNetworkingValidator": "the existing FSx file system's networking",
    "FsxAutoImportValidator": "the S3 bucket's region for FSx auto-import",
    "FsxBackupIdValidator": "the FSx backup",
    "HeadNodeLaunchTemplateValidator": "a dry-run launch of the head node",
    "HostedZoneValidator": "the Route 53 hosted zone",
    "InstanceProfileValidator": "the instance profile",
    "InstanceTypeBaseAMICompatibleValidator": "the AMI's architecture and driver against the instance type",
    "InstanceTypeValidator": "that the instance type is offered in the region",
    "KeyPairValidator": "that the EC2 key pair exists",
    "KmsKeyValidator": "the KMS key",
    "LambdaFunctionsVpcConfigValidator": "the Lambda VPC settings",
    "LaunchTemplateValidator": "a dry-run launch",
    "MungeKeySecretSizeAndBase64Validator": "the munge key secret",
    "PasswordSecretArnValidator": "the directory password secret",
    "PlacementGroupCapacityReservationValidator": "the placement group against the capacity reservation",
    "PlacementGroupNamingValidator": "that the named placement group exists",
    "RoleValidator": "the IAM role",
    "RootVolumeSizeValidator": "the root volume against the AMI's size",
    "S3BucketRegionValidator": "the S3 bucket's region",
    "S3BucketUriValidator": "the S3 bucket",
    "S3BucketValidator": "the S3 bucket",
    "SecurityGroupsValidator": "the security groups",
    "SharedEbsVolumeIdValidator": "the EBS volume",
    "SubnetsValidator": "the subnets and their VPC",
    "UltraserverCapacityBlockSizeValidator": "the ultraserver capacity block",
    "UrlValidator": "that the URL (s3://, https://) can be read",
    "AsyncTimedUrlValidator": "that the custom action script's URL (s3://, https://) can be read",
}
# Validators that read an instance type's facts: offline, they only mean something for types in our catalog.
INSTANCE_FACTS = {
    "DcvValidator", "EfaMultiAzValidator", "EfaOsArchitectureValidator", "EfaValidator",
    "FsxArchitectureOsValidator", "HeadNodeMemorySizeValidator", "InstanceArchitectureCompatibilityValidator",
    "InstanceTypeMemoryInfoValidator", "InstanceTypePlacementGroupValidator", "InstanceTypeSoftwareValidator",
    "InstancesAcceleratorsValidator", "InstancesAllocationStrategyValidator", "InstancesCPUValidator",
    "InstancesEFAValidator", "InstancesMemorySchedulingWarningValidator", "InstancesNetworkingValidator",
    "MultiNetworkInterfacesInstancesValidator", "SchedulableMemoryValidator",
}
PUBLIC_IP_CHECK = "MultiNetworkInterfacesInstancesValidator (public IPs)"
FALLBACK_REGION = "us-east-1"
OFFLINE_AMI = "ami-00000000000000000"  # stands in for the official AMI pcluster would look up on EC2
OFFLINE_AMI_ROOT_GIB = 40  # size of the official AMIs' root volume
_REGION_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")


class OfflineAccessError(AWSClientError):
    """pcluster tried to reach AWS during offline validation. An AWSClientError, so pcluster's own
    best-effort look-ups (e.g. caching capacity reservations) carry on as they do when AWS says no."""

    def __init__(self, service: str, operation: str):
        super().__init__(operation, f"needs AWS ({service}.{operation}): not checked offline")
        self.service, self.operation = service, operation


class _NoAws:
    """Stands in for a boto3 client/resource: any call fails at once, before credentials or a socket."""

    def __init__(self, service: str):
        self._service = service

    def __getattr__(self, operation: str):
        def refuse(*args: Any, **kwargs: Any):
            raise OfflineAccessError(self._service, operation)
        return refuse


@dataclasses.dataclass
class Result:
    """One pcluster finding, before it becomes a toolkit Finding."""

    level: str  # error | warning | info
    message: str
    source: str  # "schema" or the validator's class name
    path: str = ""


@dataclasses.dataclass
class Outcome:
    results: list[Result]
    not_checked: dict[str, str]  # suppressed validator -> what it would have checked
    logged: list[str] = dataclasses.field(default_factory=list)  # pcluster's own log records (pcluster_logs)
    # queues whose nodes get several network interfaces, on subnets other than the head node's -> those subnets:
    # whether they map public IPs (they must not) is unknown offline
    subnets_unchecked: dict[str, list[str]] = dataclasses.field(default_factory=dict)


@contextlib.contextmanager
def pcluster_logs() -> Iterator[list[str]]:
    """Collects the log records pcluster writes while it runs in here (warnings and worse), instead of letting them
    reach stderr: pcluster calls the root logger (`logging.warning(...)` in pcluster/config/cluster_config.py), which
    with no handler set up runs logging.basicConfig and prints raw `WARNING:root:...` lines. A handler on the root
    logger for the duration keeps basicConfig from running and takes pcluster's own loggers' records too."""
    import logging

    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    root = logging.getLogger()
    handler = Keep(logging.WARNING)
    root.addHandler(handler)
    try:
        yield messages
    finally:
        root.removeHandler(handler)


def instance_types_data() -> dict[str, dict]:
    """Our catalog in the shape of EC2's DescribeInstanceTypes, as pcluster's InstanceTypesData hook takes it."""
    data = {}
    for name, it in catalog().items():
        network: dict[str, Any] = {
            "EfaSupported": it.has_efa,
            "MaximumNetworkCards": it.network_cards,
            "NetworkCards": [
                {"NetworkCardIndex": i} | ({"MaximumNetworkInterfaces": it.network_interfaces // it.network_cards}
                                          if it.network_interfaces else {})
                for i in range(it.network_cards)],
        }
        if it.has_efa:
            network["EfaInfo"] = {"MaximumEfaInterfaces": it.efa_interfaces}
        entry: dict[str, Any] = {
            "InstanceType": name,
            "VCpuInfo": {"DefaultVCpus": it.vcpus, "DefaultCores": it.cores,
                         "DefaultThreadsPerCore": it.threads_per_core},
            "MemoryInfo": {"SizeInMiB": it.memory_gib * 1024},
            "ProcessorInfo": {"SupportedArchitectures": [it.architecture]},
            # burstable types (t2, t3) cannot join a cluster placement group
            "PlacementGroupInfo": {"SupportedStrategies": ["partition", "spread"] if it.burstable
                                   else ["cluster", "partition", "spread"]},
            "NetworkInfo": network,
            "EbsInfo": {"EbsOptimizedSupport": "default"},
            "InstanceStorageSupported": it.instance_store_gb > 0,
            "SupportedUsageClasses": ["on-demand", "spot"],
        }
        accel = family_or_none(it)
        # EC2 reports other devices (Trainium: NeuronInfo) outside GpuInfo, which pcluster ignores
        if it.gpus and accel is not None and accel.ec2_manufacturer:
            entry["GpuInfo"] = {"Gpus": [{
                "Name": it.gpu_model, "Count": it.gpus,
                "Manufacturer": accel.ec2_manufacturer,
                "MemoryInfo": {"SizeInMiB": (it.gpu_memory_gib or 0) * 1024},
            }]}
        data[name] = entry
    return data


def _stand_in_type(name: str) -> dict:
    """Facts for an instance type outside the catalog: enough for pcluster's set-up; what its validators
    conclude from them is dropped (see INSTANCE_FACTS)."""
    return {"InstanceType": name, "VCpuInfo": {"DefaultVCpus": 2, "DefaultCores": 1, "DefaultThreadsPerCore": 2},
            "MemoryInfo": {"SizeInMiB": 1024 * 1024}, "ProcessorInfo": {"SupportedArchitectures": ["x86_64"]},
            "PlacementGroupInfo": {"SupportedStrategies": ["cluster", "partition", "spread"]},
            "NetworkInfo": {"EfaSupported": False, "MaximumNetworkCards": 1, "NetworkCards": [
                {"NetworkCardIndex": 0, "MaximumNetworkInterfaces": 2}]},
            "EbsInfo": {"EbsOptimizedSupport": "default"}, "InstanceStorageSupported": False,
            "SupportedUsageClasses": ["on-demand", "spot"]}


def unknown_types(config: dict) -> dict[str, set[str]]:
    """Instance types the catalog does not know -> the key paths (head node, compute resources) using them."""
    from toolkit.cluster.checks import instance_types

    found: dict[str, set[str]] = {}
    for path, itype in instance_types(config):
        if itype not in catalog():
            found.setdefault(itype, set()).add(re.sub(r"/(Instances\[\d+\]/)?InstanceType$", "", path))
    return found


def _existing_fsx(config: dict) -> dict[str, tuple[str, str]]:
    """Existing FSx file systems and volumes the config mounts: id -> (storage Name, StorageType)."""
    keys = {"FsxLustreSettings": "FileSystemId", "FsxOpenZfsSettings": "VolumeId", "FsxOntapSettings": "VolumeId",
            "FileCacheSettings": "FileCacheId"}
    found = {}
    for storage in config.get("SharedStorage") or []:
        if not isinstance(storage, dict):
            continue
        for section, key in keys.items():
            value = (storage.get(section) or {}).get(key) if isinstance(storage.get(section), dict) else None
            if isinstance(value, str):
                found[value] = (str(storage.get("Name")), str(storage.get("StorageType")))
    return found


def _subnet_ids(config: dict) -> set[str]:
    def walk(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "SubnetId" and isinstance(value, str):
                    yield value
                elif key == "SubnetIds" and isinstance(value, list):
                    yield from (v for v in value if isinstance(v, str))
                else:
                    yield from walk(value)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)
    return set(walk(config))


def _reservations(config: dict) -> dict[str, dict]:
    """Capacity reservations the config targets, described as the config declares them (instance type of
    the compute resource, capacity block or on-demand): pcluster's set-up reads them before any validator."""
    from toolkit.cluster.checks import compute_resources

    found = {}
    for _, queue, resource in compute_resources(config):
        target = resource.get("CapacityReservationTarget") or queue.get("CapacityReservationTarget")
        reservation = target.get("CapacityReservationId") if isinstance(target, dict) else None
        if isinstance(reservation, str):
            itype = resource.get("InstanceType") or ((resource.get("Instances") or [{}])[0] or {}).get("InstanceType")
            found[reservation] = {
                "CapacityReservationId": reservation, "InstanceType": itype, "State": "active",
                "ReservationType": "capacity-block" if queue.get("CapacityType") == "CAPACITY_BLOCK" else "default"}
    return found


@contextlib.contextmanager
def _offline(region: str, subnet_ids: set[str], reservations: dict[str, dict],
             stand_ins: tuple[str, ...] = (), existing_fsx: tuple[tuple[str, str], ...] = ()):
    """pcluster with no way to AWS; every patch and variable is put back afterwards."""
    from importlib.resources import files

    from pcluster import utils
    from pcluster.aws import common
    from pcluster.aws.aws_api import AWSApi
    from pcluster.aws.aws_resources import CapacityReservationInfo, FsxStorageInfo, ImageInfo
    from pcluster.aws.ec2 import Ec2Client

    env = {"AWS_DEFAULT_REGION": region, "AWS_EC2_METADATA_DISABLED": "true", "AWS_MAX_ATTEMPTS": "1"}
    saved_env = {key: os.environ.get(key) for key in env}
    saved_inits = common.Boto3Client.__init__, common.Boto3Resource.__init__

    def client_init(self, client_name, botocore_config_kwargs=None):
        self._client = _NoAws(client_name)

    def resource_init(self, resource_name):
        self._resource = _NoAws(resource_name)

    class OfflineEc2(Ec2Client):
        def describe_image(self, ami_id):
            return ImageInfo({"ImageId": ami_id, "RootDeviceName": "/dev/sda1", "BlockDeviceMappings": [
                {"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": OFFLINE_AMI_ROOT_GIB}}]})

    os.environ.update(env)
    common.Boto3Client.__init__, common.Boto3Resource.__init__ = client_init, resource_init
    if not hasattr(utils.retrieve_supported_regions, "cache"):
        regions = (files("pcluster") / "resources" / "supported-regions").read_text()
        utils.retrieve_supported_regions.cache = regions.split("\n")
    try:
        AWSApi.reset()
        api = AWSApi.instance()
        api._ec2 = ec2 = OfflineEc2()
        ec2.additional_instance_types_data = instance_types_data() | {
            name: _stand_in_type(name) for name in stand_ins}
        for reservation, described in reservations.items():
            ec2.capacity_reservations_cache[reservation] = CapacityReservationInfo(
                described | {"AvailabilityZone": f"{region}a"})
        for subnet in subnet_ids:  # the zone is unknown offline: any zone of the region will do
            ec2.subnets_cache[subnet] = {"SubnetId": subnet, "AvailabilityZone": f"{region}a",
                                         "VpcId": "vpc-00000000000000000", "MapPublicIpOnLaunch": False}
        # existing FSx: pcluster describes them outside any validator; stand-ins in its caches, in a known subnet
        subnet = min(subnet_ids) if subnet_ids else "subnet-00000000"
        kinds = {"FsxLustre": "LUSTRE", "FsxOpenZfs": "OPENZFS", "FsxOntap": "ONTAP", "FsxFileCache": "LUSTRE"}
        for storage_id, storage_type in existing_fsx:
            file_system = storage_id
            if storage_id.startswith("fsvol-"):
                file_system = f"fs-of-{storage_id}"
                api.fsx.volume_cache[storage_id] = {
                    "VolumeId": storage_id, "FileSystemId": file_system, "OpenZFSConfiguration": {"VolumePath": "/"},
                    "OntapConfiguration": {"StorageVirtualMachineId": f"svm-of-{storage_id}", "JunctionPath": "/"}}
            api.fsx.cache[file_system] = FsxStorageInfo({
                "FileSystemId": file_system, "FileSystemType": kinds.get(storage_type, "LUSTRE"),
                "LustreConfiguration": {"MountName": "offline"}, "DNSName": f"{file_system}.offline",
                "SubnetIds": [subnet], "VpcId": "vpc-00000000000000000", "NetworkInterfaceIds": []})
        yield api
    finally:
        AWSApi.reset()
        common.Cache.clear_all()
        common.Boto3Client.__init__, common.Boto3Resource.__init__ = saved_inits
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def region_of(config: dict) -> str:
    """The config's region when it is a region name, else a fallback (pcluster's RegionValidator then reports
    the config's own value)."""
    region = config.get("Region")
    return region if isinstance(region, str) and _REGION_RE.match(region) else FALLBACK_REGION


def schema_results(errors: Any, config: Any, path: str = "") -> list[Result]:
    """marshmallow's nested error messages -> results with key paths (list items named by their Name)."""
    if isinstance(errors, str):
        errors = [errors]
    if isinstance(errors, list) and all(isinstance(e, str) for e in errors):
        got = f" (got {config!r})" if isinstance(config, (str, int, float, bool)) else ""
        return [Result("error", message + got, "schema", path) for message in errors]
    results = []
    for key, sub in (errors.items() if isinstance(errors, dict) else enumerate(errors)):
        if key == "_schema":
            results += schema_results(sub, config, path)
        elif isinstance(key, int):
            item = config[key] if isinstance(config, list) and key < len(config) else None
            name = item.get("Name") if isinstance(item, dict) and isinstance(item.get("Name"), str) else key
            results += schema_results(sub, item, f"{path}[{name}]")
        else:
            child = config.get(key) if isinstance(config, dict) else None
            results += schema_results(sub, child, f"{path}/{key}" if path else str(key))
    return results


class _Origins:
    """Runs pcluster's validators and remembers, for each result, the resource and validator that produced it.

    pcluster registers per-compute-resource validators on the queue in compute-resource order, so the k-th
    run of a validator type on a queue (when it runs once per compute resource) belongs to the k-th one.
    """

    def __init__(self) -> None:
        self.current: list[Any] = []
        self.runs: dict[tuple[int, str], int] = {}
        self.origin: dict[int, tuple] = {}  # id(result) -> (resource, validator, k-th run, of n, its arguments)
        self.crashed: dict[int, str] = {}  # id(result) -> what the validator raised
        self.suppressed: dict[str, str] = {}

    def _failed(self, validator: Any, exc: Exception) -> list:
        """A validator that raised: a refused AWS call marks it as not checked offline; anything else is
        pcluster's own bug, kept as one result marked as a crash (reported with the validator's input)."""
        from pcluster.validators.common import FailureLevel, ValidationResult

        if isinstance(exc, OfflineAccessError):
            self.suppressed[validator.type] = str(exc)
            return []
        result = ValidationResult(f"{type(exc).__name__}: {exc}", FailureLevel.WARNING, validator.type)
        self.crashed[id(result)] = f"{type(exc).__name__}: {exc}"
        return [result]

    @contextlib.contextmanager
    def installed(self):
        from pcluster.config.common import Resource
        from pcluster.validators.common import AsyncValidator

        saved_self, saved_static = Resource._validate_self, Resource.__dict__["_validator_execute"]
        origins = self

        def validate_self(resource, context, suppressors):
            origins.current.append(resource)
            try:
                saved_self(resource, context, suppressors)
            finally:
                origins.current.pop()

        def execute(validator_class, validator_args, suppressors, executor):
            resource = origins.current[-1] if origins.current else None
            name = validator_class.__name__
            if name in NEEDS_AWS:
                if any(value not in (None, False, "", [], {}) for value in validator_args.values()):
                    origins.suppressed[name] = NEEDS_AWS[name]  # it had something to check
                return None
            key = (id(resource), name)
            k = origins.runs.get(key, 0)
            origins.runs[key] = k + 1
            n = sum(1 for cls, _ in getattr(resource, "_validators", []) if cls is validator_class)
            tag = (resource, name, k, n, validator_args)
            validator = validator_class()

            def tag_all(results):
                for result in results:
                    origins.origin[id(result)] = tag
                return results

            if not issubclass(validator_class, AsyncValidator):
                try:
                    return tag_all(validator.execute(**validator_args) or [])
                except Exception as exc:  # noqa: BLE001 - sorted by _failed
                    return tag_all(origins._failed(validator, exc))

            async def run():  # an async validator: its results are tagged when awaited
                try:
                    return tag_all(await validator.execute_async(**validator_args) or [])
                except Exception as exc:  # noqa: BLE001 - sorted by _failed
                    return tag_all(origins._failed(validator, exc))
            return run()

        Resource._validate_self, Resource._validator_execute = validate_self, staticmethod(execute)
        try:
            yield self
        finally:
            Resource._validate_self, Resource._validator_execute = saved_self, saved_static


def _resource_paths(config: Any) -> dict[int, str]:
    """id(pcluster resource) -> key path for the objects that own validators: queues, compute resources,
    shared storage, head node, scheduling and the config itself."""
    paths = {id(config): ""}
    head = getattr(config, "head_node", None)
    if head is not None:
        paths[id(head)] = "HeadNode"
    scheduling = getattr(config, "scheduling", None)
    if scheduling is not None:
        paths[id(scheduling)] = "Scheduling"
        for queue in getattr(scheduling, "queues", None) or []:
            qpath = f"Scheduling/SlurmQueues[{queue.name}]"
            paths[id(queue)] = qpath
            for resource in getattr(queue, "compute_resources", None) or []:
                paths[id(resource)] = f"{qpath}/ComputeResources[{resource.name}]"
                for attr in ("efa", "networking"):
                    if getattr(resource, attr, None) is not None:
                        paths[id(getattr(resource, attr))] = f"{qpath}/ComputeResources[{resource.name}]"
            if getattr(queue, "networking", None) is not None:
                paths[id(queue.networking)] = f"{qpath}/Networking"
    for storage in getattr(config, "shared_storage", None) or []:
        paths[id(storage)] = f"SharedStorage[{storage.name}]"
    return paths


# Where a validator's finding lives below the resource that ran it: (validator, words in its message) -> key.
_KEYS = [
    ("ComputeResourceSizeValidator", "min count must be a value", "MinCount"),
    ("ComputeResourceSizeValidator", "", "MaxCount"),
    ("PlacementGroupCapacityTypeValidator", "", "Networking/PlacementGroup"),
    ("EfaValidator", "gdr", "Efa/GdrSupport"),
    ("EfaValidator", "", "Efa/Enabled"),
    ("InstancesEFAValidator", "", "Efa/Enabled"),
    ("EfaPlacementGroupValidator", "", "Networking/PlacementGroup"),
    ("InstanceTypePlacementGroupValidator", "", "Networking/PlacementGroup"),
    ("FsxPersistentOptionsValidator", "", "FsxLustreSettings/PerUnitStorageThroughput"),
    ("FsxStorageCapacityValidator", "", "FsxLustreSettings/StorageCapacity"),
    ("FsxS3Validator", "", "FsxLustreSettings/ImportPath"),
    ("FsxStorageTypeOptionsValidator", "", "FsxLustreSettings/StorageType"),
    ("FsxBackupOptionsValidator", "", "FsxLustreSettings"),
    ("SharedStorageMountDirValidator", "", "MountDir"),
    ("NameValidator", "", "Name"),
    ("QueueNameValidator", "", "Name"),
    ("ComputeResourceNameValidator", "", "Name"),
    ("SharedStorageNameValidator", "", "Name"),
    ("ClusterNameValidator", "", "Name"),
    ("RegionValidator", "", "Region"),
    ("SchedulerOsValidator", "", "Image/Os"),
    ("ArchitectureOsValidator", "", "Image/Os"),
    ("HeadNodeMemorySizeValidator", "", "HeadNode/InstanceType"),
    ("MultiNetworkInterfacesInstancesValidator", "assignpublicip", "Networking/AssignPublicIp"),
    ("MultiNetworkInterfacesInstancesValidator", "", "Networking/SubnetIds"),
    ("CustomSlurmSettingsValidator", "", "CustomSlurmSettings"),
]
# Validators a queue runs once per compute resource (in order) without naming it in their arguments.
_PER_COMPUTE_RESOURCE = {"EfaValidator", "EfaPlacementGroupValidator", "ComputeResourceSizeValidator"}
# Validators the cluster runs once per compute resource of every queue (in order), naming neither.
_PER_CLUSTER_COMPUTE_RESOURCE = {"PlacementGroupCapacityTypeValidator"}
_QUEUE_IN_MESSAGE = re.compile(r"[Qq]ueue '?([a-z][a-z0-9-]*)'?")
_CR_IN_MESSAGE = re.compile(r"[Cc]ompute [Rr]esource '?([A-Za-z0-9][A-Za-z0-9-]*)'?")


def _path_for(result: Any, tag: tuple | None, paths: dict[int, str], config: Any) -> str:
    """The key path a pcluster result concerns: from the resource that ran the validator, the queue and
    compute resource named in its arguments or message, and the key the validator checks."""
    if tag is None:
        return ""
    resource, name, k, n, args = tag
    base = paths.get(id(resource), "")
    queues = {q.name: q for q in getattr(getattr(config, "scheduling", None), "queues", None) or []}
    queue = next((q for q in queues.values() if base.startswith(f"Scheduling/SlurmQueues[{q.name}]")), None)
    if queue is None:
        match = _QUEUE_IN_MESSAGE.search(result.message)
        queue = queues.get(args.get("queue_name") or (match.group(1) if match else None))
    match = _CR_IN_MESSAGE.search(result.message)
    wanted = args.get("compute_resource_name") or (match.group(1) if match else None)
    owners = [(q, r) for q in ([queue] if queue else queues.values()) for r in q.compute_resources
              if r.name == wanted or (not wanted and args.get("instance_type") in r.instance_types)]
    if queue and not owners and name in _PER_COMPUTE_RESOURCE and n == len(queue.compute_resources):
        owners = [(queue, queue.compute_resources[k])]
    every = [(q, r) for q in queues.values() for r in q.compute_resources]
    if not owners and name in _PER_CLUSTER_COMPUTE_RESOURCE and n == len(every):
        owners = [every[k]]
    if "/ComputeResources[" not in base and len(owners) == 1:
        base = f"Scheduling/SlurmQueues[{owners[0][0].name}]/ComputeResources[{owners[0][1].name}]"
    elif queue and not base.startswith("Scheduling/SlurmQueues["):
        base = f"Scheduling/SlurmQueues[{queue.name}]"
    for validator, words, key in _KEYS:
        if validator == name and words in result.message.lower():
            return f"{base}/{key}" if base else key
    return base


def _level(failure_level: Any) -> str:
    return {"ERROR": "error", "WARNING": "warning"}.get(str(failure_level), "info")


def _describe(args: dict) -> str:
    """A validator's input in one line: plain values as they are, pcluster objects by their type."""
    def show(value: Any) -> str:
        if value is None or isinstance(value, (str, int, float, bool)):
            return repr(value)
        if isinstance(value, (list, tuple)):
            return "[" + ", ".join(show(v) for v in value) + "]"
        return f"<{type(value).__name__}>"
    return ", ".join(f"{key}={show(value)}" for key, value in args.items())


def _public_subnet_risk(loaded: Any, ec2: Any) -> tuple[list[Result], dict[str, list[str]]]:
    """pcluster's MultiNetworkInterfacesInstancesValidator again, with every subnet mapping public IPs (offline
    we cannot know which do): a multi-NIC queue on the head node's subnet is a warning (head node subnets are
    usually public, for SSH); multi-NIC queues on other subnets are listed as not checked."""
    from pcluster.utils import get_attr
    from pcluster.validators.cluster_validators import MultiNetworkInterfacesInstancesValidator

    for subnet in ec2.subnets_cache.values():
        subnet["MapPublicIpOnLaunch"] = True
    head_subnet = get_attr(loaded, "head_node.networking.subnet_id")
    risks, unchecked = [], {}
    for queue in get_attr(loaded, "scheduling.queues") or []:
        try:
            failures = MultiNetworkInterfacesInstancesValidator().execute(
                queues=[queue], efa_interface_type=get_attr(loaded, "dev_settings.efa_interface_type"))
        except Exception:  # noqa: BLE001 - the main run already reported a crash of this validator
            continue
        failures = [f for f in failures if "auto-assign public IPs" in str(f.message)]
        if not failures:
            continue
        subnets = list(queue.networking.subnet_ids)
        if head_subnet in subnets:
            risks.append(Result(
                "warning", f"queue {queue.name} uses the head node's subnet {head_subnet}; if that subnet maps "
                f"public IPs on launch (a head node reached over SSH sits in one in AWS's samples), pcluster "
                f"create-cluster and update-cluster fail: {failures[0].message}",
                "MultiNetworkInterfacesInstancesValidator",
                f"Scheduling/SlurmQueues[{queue.name}]/Networking/SubnetIds"))
        else:
            unchecked[queue.name] = subnets
    return risks, unchecked


def validate(config: dict, semantic: bool = True, cluster_name: str = "hpc-offline") -> Outcome:
    """pcluster's schema, then (when it loads and `semantic`) its semantic validators, offline; what pcluster logged
    meanwhile in Outcome.logged. Raises OfflineAccessError when pcluster needs AWS outside a validator (nothing
    was sent: the call was refused before any I/O)."""
    with pcluster_logs() as logged:
        outcome = _validate(config, semantic, cluster_name)
    outcome.logged = list(dict.fromkeys(logged))
    return outcome


def _validate(config: dict, semantic: bool, cluster_name: str) -> Outcome:
    from marshmallow import ValidationError
    from pcluster.config.common import ValidatorContext
    from pcluster.schemas.cluster_schema import ClusterSchema

    unknown = unknown_types(config)
    existing = _existing_fsx(config)
    with _offline(region_of(config), _subnet_ids(config), _reservations(config), tuple(sorted(unknown)),
                  tuple(sorted((i, kind) for i, (_, kind) in existing.items()))) as api:
        try:
            loaded = ClusterSchema(cluster_name=cluster_name).load(config)
        except ValidationError as exc:
            return Outcome(schema_results(exc.messages, config), {})
        if not semantic:
            return Outcome([], {})
        loaded.official_ami = OFFLINE_AMI
        with _Origins().installed() as origins:
            failures = loaded.validate([], ValidatorContext())
        paths = _resource_paths(loaded)
        results, limited = [], {}
        for failure in failures:
            tag = origins.origin.get(id(failure))
            name, message = failure.validator_type, str(failure.message)
            if message.startswith("needs AWS ("):  # a validator that caught our refusal and reported it
                origins.suppressed[name] = message
                continue
            path = _path_for(failure, tag, paths, loaded)
            if name in INSTANCE_FACTS:
                touched = [t for t, where in unknown.items() if t in message
                           or t in _describe(tag[4] if tag else {}) or any(path.startswith(w) for w in where)]
                if touched:
                    limited[name] = f"needs the facts of {', '.join(touched)}, not in the toolkit's catalog"
                    continue
            if id(failure) in origins.crashed:
                results.append(Result("warning", f"pcluster's {name} failed to run ({origins.crashed[id(failure)]}) "
                                      f"on the input {_describe(tag[4] if tag else {})}: this check was not done",
                                      name, path))
                limited[name] = "failed to run on this config (pcluster's own error)"
                continue
            results.append(Result(_level(failure.level), message, name, path))
        if "Region" in config:  # pcluster checks the region of its command line, not the file's: we do
            from pcluster.validators.cluster_validators import RegionValidator
            results += [Result(_level(f.level), f.message, f.validator_type, "Region")
                        for f in RegionValidator().execute(region=config["Region"])]
        risks, unchecked = _public_subnet_risk(loaded, api.ec2)
        not_checked = origins.suppressed | limited
        if unchecked:
            not_checked[PUBLIC_IP_CHECK] = (
                "that the subnets of queues whose nodes get several network interfaces do not auto-assign public IPs "
                "(they must be private, with a NAT gateway): "
                + "; ".join(f"{name} ({', '.join(subnets)})" for name, subnets in unchecked.items()))
        if existing:
            not_checked["existing FSx"] = ("that these existing file systems and volumes exist, are reachable from "
                                           "the subnets and have the mount paths pcluster reads from them: "
                                           + ", ".join(f"{i} ({name})" for i, (name, _) in sorted(existing.items())))
        return Outcome(results + risks, dict(sorted(not_checked.items())), subnets_unchecked=unchecked)
