"""`hpc cluster validate`: a ParallelCluster v3 config checked offline.

Three layers, each giving findings with key paths: the YAML itself (syntax, duplicate keys, shape), then
aws-parallelcluster's own schema and semantic validators run offline (toolkit.cluster.pcluster_offline), then
the toolkit's checks for what pcluster cannot see offline (toolkit.cluster.checks).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path
from typing import cast

from toolkit.cluster import checks, yamlsource
from toolkit.cluster.findings import Finding, Level, has_errors
from toolkit.errors import HpcError

INSTALL_FIX = "pip install 'hpc-toolkit[admin]' (it brings aws-parallelcluster==3.16.1)"
_LEVEL_ORDER = {"error": 0, "warning": 1, "info": 2}

# Fixes for pcluster messages, by validator or message: (source, regex on the message) -> fix.
_FIXES = [
    (".*", r"failed to run \(", "nothing to change for this check: it is a fault in aws-parallelcluster's validator, "
     "not in the file; the other checks ran (see the ParallelCluster docs for the setting it reads)"),
    ("MultiNetworkInterfacesInstancesValidator", r"AssignPublicIp", "set Networking/AssignPublicIp: false and "
     "use a private subnet with a NAT gateway"),
    ("MultiNetworkInterfacesInstancesValidator", r"", "give the queue a private subnet with a NAT gateway "
     "(`hpc cluster queue set FILE QUEUE --subnet SUBNET_ID`; in a new config `hpc cluster config --compute-subnet`), "
     "or make sure the subnet does not auto-assign public IPs"),
    ("RegionValidator", r"", "write a region ParallelCluster supports, e.g. us-east-1; a ${VARIABLE} must be "
     "substituted first (e.g. envsubst < template.yaml > cluster.yaml)"),
    ("schema", r"Unknown field", "remove the key, or fix its spelling/indentation (see the ParallelCluster v3 "
     "configuration reference)"),
    ("schema", r"Missing data for required field", "add the key"),
    ("schema", r"Must be one of", "use one of the listed values"),
    ("schema", r"Not a valid|Invalid input type", "give a value of the expected type"),
    ("schema", r"greater than or equal to 1", "use 1 or more"),
    ("ComputeResourceSizeValidator", r"", "make MaxCount >= MinCount (MinCount 0 lets nodes scale to zero)"),
    ("EfaValidator", r"GDR", "enable EFA on the compute resource (Efa/Enabled: true), or remove GdrSupport "
     "(it has had no effect since ParallelCluster 3.0.2)"),
    ("EfaValidator|InstancesEFAValidator", r"not support EFA", "use an instance type with EFA (efa_interfaces in "
     "toolkit/catalog.yaml) or set Efa/Enabled: false"),
    ("EfaValidator|InstancesEFAValidator", r"enhanced networking", "set Efa/Enabled: true and "
     "Networking/PlacementGroup/Enabled: true on the compute resource"),
    ("EfaPlacementGroupValidator", r"must be explicit", "add Networking/PlacementGroup/Enabled: true to the "
     "compute resource (or Enabled: false when a capacity reservation brings its own placement)"),
    ("EfaPlacementGroupValidator", r"", "enable the placement group unless a capacity reservation brings its "
     "own"),
    ("FsxStorageCapacityValidator", r"", "use 1200, 2400 or a multiple of 2400 GiB (SCRATCH_2, PERSISTENT_*)"),
    ("FsxPersistentOptionsValidator", r"", "set FsxLustreSettings/PerUnitStorageThroughput (125, 250, 500 or "
     "1000 for PERSISTENT_2)"),
    ("QueueNameValidator|NameValidator", r"", "use at most 25 lower-case letters, digits and '-', starting with "
     "a letter"),
]


@functools.cache
def parallelcluster_release() -> str | None:
    """The aws-parallelcluster release whose schema and validators judge configs here (None: not installed)."""
    from importlib import metadata

    try:
        return metadata.version("aws-parallelcluster")
    except metadata.PackageNotFoundError:
        return None


@dataclasses.dataclass
class Report:
    file: str
    findings: list[Finding]
    not_checked: dict[str, str]  # pcluster validators that need AWS -> what they would check
    subnets_unchecked: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # see pcluster_offline.Outcome
    # the aws-parallelcluster release that judged it (its schema and validators): another release may judge otherwise
    parallelcluster: str | None = dataclasses.field(default_factory=parallelcluster_release)

    @property
    def valid(self) -> bool:
        return not has_errors(self.findings)

    def as_dict(self) -> dict:
        return {"file": self.file, "valid": self.valid, "parallelcluster": self.parallelcluster,
                "findings": [f.as_dict() for f in self.findings], "not_checked_offline": self.not_checked}


# The fix for a value that does not match its schema pattern, by the key it sits under.
_PATTERN_FIXES = {
    "SubnetId": "give a subnet id: 'subnet-' and 8 or 17 lower-case hex digits, e.g. subnet-0123456789abcdef0",
    "SubnetIds": "give subnet ids: 'subnet-' and 8 or 17 lower-case hex digits, e.g. subnet-0123456789abcdef0",
    "CustomAmi": "give an AMI id: 'ami-' and 8 or 17 lower-case hex digits, e.g. ami-0123456789abcdef0",
    "CapacityReservationId": "give a capacity reservation id: 'cr-' and 17 lower-case hex digits, e.g. "
                             "cr-0123456789abcdef0",
    "SecurityGroups": "give security group ids: 'sg-' and 8 or 17 lower-case hex digits",
    "AdditionalSecurityGroups": "give security group ids: 'sg-' and 8 or 17 lower-case hex digits",
    "FileSystemId": "give a file system id: 'fs-' and 8 or 17 lower-case hex digits, e.g. fs-0123456789abcdef0",
    "VolumeId": "give the volume id: 'fsvol-' and 17 hex digits for FSx, 'vol-' and 8 or 17 for EBS",
    "SnapshotId": "give a snapshot id: 'snap-' and 8 or 17 lower-case hex digits",
    "Name": "use lower-case letters, digits and '-', starting with a letter (queue and compute resource names; "
            "at most 25 characters)",
    "InstanceRole": "give an IAM role ARN: arn:PARTITION:iam::ACCOUNT:role/NAME",
    "InstanceProfile": "give an IAM instance profile ARN: arn:PARTITION:iam::ACCOUNT:instance-profile/NAME",
    "Policy": "give an IAM policy ARN: arn:PARTITION:iam::ACCOUNT:policy/NAME",
}


# Values a ParallelCluster release took away, by key: value -> (the release it went in, what replaces it). The
# schema's own error lists what the pinned release takes; this says why a value that worked before fails now.
# alinux2: not in aws-parallelcluster 3.16's SUPPORTED_OSES (cli/src/pcluster/constants.py), which the schema's
# Image/Os choice reads; 3.15 still had it (field notes, ../shared/FIELD-NOTES.md).
# ubuntu2004 and centos7 are in AWS's published samples and configs of 3.x clusters still running (the release
# that dropped each is not recorded here: None).
DROPPED_VALUES: dict[str, dict[str, tuple[str | None, str]]] = {
    "Os": {"alinux2": ("3.16", "alinux2023 (Amazon Linux 2023)"),
           "ubuntu2004": (None, "ubuntu2204 or ubuntu2404 (Ubuntu 22.04 or 24.04 LTS)"),
           "centos7": (None, "rocky8, rocky9 (its successors) or alinux2023")}}


def _dropped_value_fix(message: str, path: str) -> str | None:
    key = re.sub(r"\[[^\]]*\]$", "", path).rsplit("/", 1)[-1]
    got = re.search(r"\(got '([^']*)'\)", message)
    dropped = DROPPED_VALUES.get(key, {}).get(got.group(1)) if got else None
    if got is None or dropped is None:
        return None
    release, replacement = dropped
    went = (f"was dropped in ParallelCluster {release}" if release else
            f"is not in ParallelCluster {parallelcluster_release()}, though earlier 3.x releases had it")
    return (f"{key}: {got.group(1)} {went}; use {replacement}, or manage a cluster that must keep it with the "
            "pcluster release it was made with")


def _fix_for(source: str, message: str, path: str = "") -> str | None:
    if source == "schema" and "Must be one of" in message and (dropped := _dropped_value_fix(message, path)):
        return dropped
    if source == "schema" and path.endswith("Scheduler") and "'awsbatch'" in message:
        return (f"the pinned aws-parallelcluster {parallelcluster_release()} has only the slurm scheduler "
                "(pcluster/constants.py SUPPORTED_SCHEDULERS): manage an AWS Batch cluster with the pcluster "
                "release it was made with, or move its work to Slurm queues (Scheduling/SlurmQueues)")
    if source == "schema" and "does not match expected" in message:
        key = re.sub(r"\[[^\]]*\]$", "", path).rsplit("/", 1)[-1]
        return _PATTERN_FIXES.get(key, f"write {key or 'the value'} in the format the ParallelCluster v3 "
                                       "configuration reference gives for it")
    for sources, pattern, fix in _FIXES:
        if re.fullmatch(sources, source) and re.search(pattern, message):
            return fix
    return None


def _line_of(path: str, lines: dict[str, int]) -> int | None:
    """The line of the key path, or of its closest parent that the file has."""
    while path:
        if path in lines:
            return lines[path]
        parent = re.sub(r"(/?[^/\[\]]+|\[[^\]]*\])$", "", path)
        if parent == path:
            break
        path = parent
    return None


def _pcluster_findings(config: dict) -> tuple[list[Finding], dict[str, str], dict[str, list[str]]]:
    """(findings, what was not checked offline, the queues whose subnets' public IPs were not checked)."""
    try:
        from toolkit.cluster import pcluster_offline
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in ("pcluster", "marshmallow", "boto3", "botocore"):
            raise
        raise HpcError("aws-parallelcluster is not installed: `hpc cluster validate` runs its schema and "
                       "validators offline", fix=INSTALL_FIX) from None

    from toolkit.progress import step

    try:
        with step(f"running aws-parallelcluster {parallelcluster_release()}'s validators offline"):
            outcome = pcluster_offline.validate(config)
    except pcluster_offline.OfflineAccessError as exc:
        return [Finding("error", "", f"pcluster wanted AWS ({exc.service}.{exc.operation}) to validate this "
                        "config; nothing was sent, and the config is not fully checked offline",
                        "report it: the toolkit suppresses the validators that need AWS",
                        source="pcluster")], {}, {}
    found = [Finding(cast(Level, r.level), r.path, r.message, _fix_for(r.source, r.message, r.path), source=r.source)
             for r in outcome.results]
    found += [Finding("warning", "", f"pcluster logged while checking this config offline: {message}",
                      "nothing to change for this alone: offline, pcluster cannot ask AWS, and what it would have "
                      "asked is listed under 'not checked offline'" if "Unable to" in message else None,
                      source="pcluster log") for message in outcome.logged]
    return found, outcome.not_checked, outcome.subnets_unchecked


def validate_config(config: dict, file: str = "<config>", lines: dict[str, int] | None = None) -> Report:
    """Findings for a config mapping (already read): pcluster offline, then the toolkit's own checks."""
    ours = checks.check(config)
    theirs, not_checked, subnets_unchecked = _pcluster_findings(config)
    findings = [dataclasses.replace(f, file=file, line=_line_of(f.path, lines or {}))
                for f in _template_variables(config, theirs + ours, file)]
    findings.sort(key=lambda f: (_LEVEL_ORDER[f.level], f.line or 0))
    return Report(file, findings, not_checked, subnets_unchecked)


def _template_variables(config: dict, found: list[Finding], file: str) -> list[Finding]:
    """A `${VAR}` left in for envsubst (AWS's samples are templates): said as such where pcluster reports the
    value (its pattern error names the literal), and reported where pcluster takes it (Region: ${AWS_REGION})."""
    from toolkit.cluster.configfile import TEMPLATE_WORDS, template_fix, template_variables

    variables = template_variables(config)
    said = set()
    out = []
    for f in found:
        hit = next((path for path, name in variables.items()
                    if f.path == path or f"'${{{name}}}" in f.message or f"${{{name}}}'" in f.message), None)
        if hit is not None:
            said.add(hit)
            f = dataclasses.replace(f, fix=template_fix(variables[hit], file))
        out.append(f)
    out += [Finding("error", path, TEMPLATE_WORDS.format(name), template_fix(name, file), source="hpc")
            for path, name in variables.items() if path not in said]
    return out


def validate_text(text: str, file: str = "<config>") -> Report:
    config, lines, problems = yamlsource.parse(text, file)
    if problems or config is None:
        return Report(file, problems, {})
    return validate_config(config, file, lines)


def validate_file(path: str | Path) -> Report:
    """Validate a ParallelCluster v3 config file offline: the Report lists findings (level, key path, line,
    message, fix) and the pcluster validators not checked offline. Raises HpcError only when the file
    cannot be read or aws-parallelcluster is missing."""
    from toolkit.textfile import read_text

    text = read_text(path, "cluster config", fix="pass the path of a ParallelCluster config file")
    return validate_text(text, str(path))
