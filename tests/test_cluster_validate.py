"""Offline validation: every planted fault is caught with its key path; malformed input gives findings."""

import copy
import json

import pytest
import yaml

from tests.conftest import REPO
from toolkit.cluster.validate import validate_config, validate_text

P3DN = yaml.safe_load((REPO / "cluster-configs" / "p3dn-efa-fsx.yaml").read_text())
P5 = yaml.safe_load((REPO / "cluster-configs" / "p5-reservation.yaml").read_text())
QUEUE = "Scheduling/SlurmQueues[p3dn]"
CR = f"{QUEUE}/ComputeResources[p3dn-24xlarge]"
FSX = "SharedStorage[fsx]/FsxLustreSettings"


def _queue(c):
    return c["Scheduling"]["SlurmQueues"][0]


def _cr(c):
    return _queue(c)["ComputeResources"][0]


def _fsx(c):
    return c["SharedStorage"][0]["FsxLustreSettings"]


def _errors(config):
    return {(f.path, f.source) for f in validate_config(config, "planted.yaml").findings if f.level == "error"}


def _planted(change, base=P3DN):
    config = copy.deepcopy(base)
    change(config)
    return config


FAULTS = {
    "MaxCount < 1": (lambda c: _cr(c).update(MaxCount=0), f"{CR}/MaxCount", "schema"),
    "MinCount > MaxCount": (lambda c: _cr(c).update(MinCount=9, MaxCount=2), f"{CR}/MaxCount",
                            "ComputeResourceSizeValidator"),
    "GdrSupport without EFA": (lambda c: _cr(c).update(Efa={"Enabled": False, "GdrSupport": True}),
                               f"{CR}/Efa/GdrSupport", "EfaValidator"),
    "EFA, placement group left out": (lambda c: _cr(c).pop("Networking"), f"{CR}/Networking/PlacementGroup",
                                      "EfaPlacementGroupValidator"),
    "EFA on an instance without it": (lambda c: _cr(c).update(InstanceType="m5.8xlarge"), f"{CR}/Efa/Enabled",
                                      "EfaValidator"),
    "FSx SCRATCH_2 capacity 1000": (lambda c: _fsx(c).update(StorageCapacity=1000), f"{FSX}/StorageCapacity",
                                    "FsxStorageCapacityValidator"),
    "ImportPath with PERSISTENT_2": (lambda c: _fsx(c).update(DeploymentType="PERSISTENT_2",
                                                               PerUnitStorageThroughput=125),
                                     f"{FSX}/ImportPath", "hpc"),
    "unknown key": (lambda c: _cr(c).update(MaxNodes=4), f"{CR}/MaxNodes", "schema"),
    "queue name pattern": (lambda c: _queue(c).update(Name="P3dn_queue"),
                           "Scheduling/SlurmQueues[P3dn_queue]/Name", "NameValidator"),
    "missing HeadNode": (lambda c: c.pop("HeadNode"), "HeadNode", "schema"),
    "alinux2 (gone in 3.16)": (lambda c: c["Image"].update(Os="alinux2"), "Image/Os", "schema"),
    "V100 without a custom AMI": (lambda c: c["Image"].pop("CustomAmi"), f"{CR}/InstanceType", "hpc"),
    "wrong type": (lambda c: _cr(c).update(MaxCount="eight"), f"{CR}/MaxCount", "schema"),
    "PERSISTENT_2 without throughput": (lambda c: (_fsx(c).update(DeploymentType="PERSISTENT_2"),
                                                   _fsx(c).pop("ImportPath")),
                                        f"{FSX}/PerUnitStorageThroughput", "FsxPersistentOptionsValidator"),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_planted_fault_is_an_error_at_its_key_path(fault):
    change, path, source = FAULTS[fault]
    assert (path, source) in _errors(_planted(change))


@pytest.mark.parametrize("example", [P3DN, P5], ids=["p3dn", "p5"])
def test_examples_have_no_errors(example):
    report = validate_config(copy.deepcopy(example))
    assert report.valid, [f for f in report.findings if f.level == "error"]
    assert "KeyPairValidator" in report.not_checked  # needs AWS: listed, not run


def test_disabled_placement_group_with_efa_is_pclusters_warning():
    report = validate_config(_planted(lambda c: _cr(c).update(Networking={"PlacementGroup": {"Enabled": False}})))
    assert report.valid
    assert any(f.level == "warning" and f.path == f"{CR}/Networking/PlacementGroup"
               and f.source == "EfaPlacementGroupValidator" for f in report.findings)


def test_v100_with_a_custom_ami_is_a_warning_with_the_reminder():
    findings = validate_config(copy.deepcopy(P3DN)).findings
    reminder = [f for f in findings if f.path == f"{CR}/InstanceType"]
    assert [f.level for f in reminder] == ["warning"]
    assert "InstanceTypeBaseAMICompatibleValidator" in reminder[0].message


def test_v100_without_custom_ami_explains_the_fix():
    finding = next(f for f in validate_config(_planted(lambda c: c["Image"].pop("CustomAmi"))).findings
                   if f.path == f"{CR}/InstanceType")
    assert "OpenRM" in finding.message and "build-image" in finding.fix and "CustomAmi" in finding.fix


def test_placement_group_with_a_targeted_reservation_is_flagged():
    def enable(c):
        c["Scheduling"]["SlurmQueues"][0]["ComputeResources"][0]["Networking"]["PlacementGroup"]["Enabled"] = True
    findings = validate_config(_planted(enable, P5)).findings
    path = "Scheduling/SlurmQueues[p5]/ComputeResources[p5-48xlarge]/Networking/PlacementGroup"
    assert any(f.source == "hpc" and f.path == path and "reservation" in f.message for f in findings)


def test_gdr_without_efa_on_an_instances_list_is_caught_by_our_check():
    def flexible(c):
        resource = _cr(c)
        resource["Instances"] = [{"InstanceType": resource.pop("InstanceType")}]
        resource["Efa"] = {"Enabled": False, "GdrSupport": True}
    assert (f"{CR}/Efa/GdrSupport", "hpc") in _errors(_planted(flexible))


def test_findings_carry_file_and_line():
    text = (REPO / "cluster-configs" / "p3dn-efa-fsx.yaml").read_text().replace("MaxCount: 8", "MaxCount: 0")
    finding = next(f for f in validate_text(text, "c.yaml").findings if f.path == f"{CR}/MaxCount")
    assert finding.file == "c.yaml"
    assert text.splitlines()[finding.line - 1].strip().startswith("MaxCount: 0")


@pytest.mark.parametrize("text,line,words", [
    ("Region: us-east-1\nHeadNode: [\n", 3, "not valid YAML"),
    ("Region: us-east-1\nImage:\n  Os: ubuntu2204\n  Os: rocky9\n", 4, "duplicate key 'Os'"),
    ("", None, "empty"),
    ("# only a comment\n", None, "empty"),
    ("- Region: us-east-1\n", 1, "mapping"),
    ("just text\n", 1, "mapping"),
    ("Region: us-east-1\n\tHeadNode: {}\n", 2, "not valid YAML"),
])
def test_malformed_yaml_is_a_finding_with_its_line(text, line, words):
    report = validate_text(text, "bad.yaml")
    assert not report.valid
    assert [(f.line, f.path) for f in report.findings] == [(line, "")]
    assert words in report.findings[0].message


@pytest.mark.parametrize("change", [
    lambda c: c.update(Scheduling="slurm"),
    lambda c: c.update(SharedStorage={"Name": "fsx"}),
    lambda c: _queue(c).update(ComputeResources="p3dn"),
    lambda c: c["HeadNode"].update(Ssh=["my-key"]),
    lambda c: c.update(Region=42),
], ids=["scheduling-str", "storage-map", "resources-str", "ssh-list", "region-int"])
def test_wrong_types_are_findings_not_tracebacks(change):
    report = validate_config(_planted(change))
    assert not report.valid and all(f.message for f in report.findings)


def test_validation_leaves_pyyaml_safeloader_alone():
    before = dict(yaml.SafeLoader.yaml_constructors)
    validate_text("Region: us-east-1\nRegion: us-east-2\n", "dup.yaml")
    validate_config(copy.deepcopy(P3DN))
    assert dict(yaml.SafeLoader.yaml_constructors) == before
    assert yaml.safe_load("a: 1\na: 2\n") == {"a": 2}  # PyYAML's own behaviour, unchanged


def test_custom_action_scripts_on_a_branch_get_a_warning_naming_them():
    # a script fetched from a branch runs as root on every node as the branch holds it at boot; a moved file fails
    # OnNodeConfigured and the cluster ends CREATE_FAILED. A commit, a tag or the admin's S3 copy holds still.
    config = copy.deepcopy(P5)
    commit = "5f87e2af8e3bce3c5dc2e699336b3cd36e3aaa1f"
    raw = "https://raw.githubusercontent.com/aws-samples/aws-parallelcluster-post-install-scripts"
    config["HeadNode"]["CustomActions"] = {
        "OnNodeConfigured": {"Script": f"{raw}/main/pyxis/postinstall.sh"},
        "OnNodeStart": {"Script": f"{raw}/{commit}/enable-pyxis/head-node/postscript.sh"}}
    queue = config["Scheduling"]["SlurmQueues"][0]
    queue["CustomActions"] = {"OnNodeStart": {"Sequence": [
        {"Script": "s3://my-bucket/enable-pyxis.sh", "Args": ["compute-node"]},
        {"Script": "https://github.com/org/tools/raw/refs/heads/dev/setup.sh"},
        {"Script": "https://raw.githubusercontent.com/org/tools/refs/tags/v1.2/setup.sh"}]}}
    warned = {f.path: f for f in validate_config(config).findings if "not a commit" in f.message}
    assert set(warned) == {"HeadNode/CustomActions/OnNodeConfigured/Script",
                           f"Scheduling/SlurmQueues[{queue['Name']}]/CustomActions/OnNodeStart/Sequence[1]/Script"}
    head = warned["HeadNode/CustomActions/OnNodeConfigured/Script"]
    assert head.level == "warning" and "'main'" in head.message and "pyxis/postinstall.sh" in head.message
    assert "40-hex commit" in head.fix and "s3://" in head.fix
    assert "'refs/heads/dev'" in warned[f"Scheduling/SlurmQueues[{queue['Name']}]/CustomActions/OnNodeStart/"
                                         "Sequence[1]/Script"].message
    assert validate_config(config).valid  # a warning: the file is still a valid config


def test_a_value_a_release_dropped_says_when_it_went_and_what_replaces_it(hpc, tmp_path):
    from importlib import metadata

    path = tmp_path / "al2.yaml"
    path.write_text(yaml.safe_dump(_planted(lambda c: c["Image"].update(Os="alinux2"))))
    res = hpc("cluster", "validate", str(path))
    assert res.returncode == 1
    release = metadata.version("aws-parallelcluster")
    # the verdict names the release that judged it: another pcluster may judge the same file otherwise
    assert res.stdout.splitlines()[0].startswith(f"{path}: INVALID by ParallelCluster {release}'s rules")
    assert "fix: Os: alinux2 was dropped in ParallelCluster 3.16; use alinux2023" in res.stdout
    # a value no release had gets the schema's own list, not a history
    other = validate_config(_planted(lambda c: c["Image"].update(Os="windows")))
    assert [f.fix for f in other.findings if f.path == "Image/Os"] == ["use one of the listed values"]
    data = json.loads(hpc("cluster", "validate", str(path), "--json").stdout)["data"]
    assert data["parallelcluster"] == release and not data["valid"]
