"""Configs that deploy: what `hpc cluster config` writes passes pcluster 3.16's create-time rules we can run
offline (multi-NIC public IPs, Capacity Blocks), and `validate` handles published-style configs (small instance
types, existing FSx, a pcluster validator that crashes, a bad Region, pattern errors)."""

import json
import re
import shlex

import pytest
import yaml

from tests.conftest import cli_json, REPO, run_hpc
from toolkit.catalog import instance
from toolkit.cluster.build import ClusterSpec, QueueSpec, build_config, render
from toolkit.cluster.validate import validate_config, validate_file, validate_text

DATA = REPO / "tests" / "data" / "cluster"
HEAD, COMPUTE = "subnet-0123456789abcdef0", "subnet-0fedcba9876543210"
AMI = "ami-0123456789abcdef0"
CR_ID = "cr-0123456789abcdef0"
MULTI_NIC = ["p3dn.24xlarge", "p4d.24xlarge", "p5.48xlarge", "c5n.18xlarge", "dl1.24xlarge"]


def _config(itype, head=HEAD, compute=COMPUTE, **extra):
    spec = ClusterSpec(name="demo", region="us-east-1", head_subnet=head, compute_subnet=compute, key_name="me",
                       queues=(QueueSpec("q", itype, 2),), custom_ami=AMI, **extra)
    return yaml.safe_load(render(build_config(spec)[0]))


def _errors(report):
    return [(f.path, f.source) for f in report.findings if f.level == "error"]


def _multi_nic_failures(config, public: set[str]):
    """pcluster's own MultiNetworkInterfacesInstancesValidator on the loaded config, with the given subnets
    mapping public IPs (what EC2 DescribeSubnets would say) and the others private."""
    from pcluster.schemas.cluster_schema import ClusterSchema
    from pcluster.validators.cluster_validators import MultiNetworkInterfacesInstancesValidator

    from toolkit.cluster import pcluster_offline

    subnets = pcluster_offline._subnet_ids(config)
    with pcluster_offline._offline("us-east-1", subnets, {}) as api:
        loaded = ClusterSchema(cluster_name="t").load(config)
        for subnet in subnets:
            api.ec2.subnets_cache[subnet]["MapPublicIpOnLaunch"] = subnet in public
        return [f.message for f in MultiNetworkInterfacesInstancesValidator().execute(
            queues=loaded.scheduling.queues, efa_interface_type=None)]


@pytest.mark.parametrize("itype", MULTI_NIC)
def test_written_config_passes_the_multi_nic_rule_with_a_private_compute_subnet(itype):
    config = _config(itype)
    assert _multi_nic_failures(config, public={HEAD}) == []  # the head node's public subnet is no problem
    failures = _multi_nic_failures(config, public={COMPUTE})  # the same file with a public compute subnet fails:
    assert len(failures) == 1 and "auto-assign public IPs" in failures[0]  # the rule sees these nodes' NICs
    report = validate_config(config)
    assert report.valid, _errors(report)
    assert COMPUTE in report.not_checked["MultiNetworkInterfacesInstancesValidator (public IPs)"]
    assert "private subnet with a NAT gateway" in render(build_config(ClusterSpec(
        name="demo", region="us-east-1", head_subnet=HEAD, compute_subnet=COMPUTE, key_name="me",
        queues=(QueueSpec("q", itype, 2),), custom_ami=AMI))[0])


def test_a_single_nic_queue_is_not_at_risk():
    config = _config("m5.8xlarge", compute=HEAD)
    assert _multi_nic_failures(config, public={HEAD}) == []
    report = validate_config(config)
    assert not any(f.source == "MultiNetworkInterfacesInstancesValidator" for f in report.findings)
    assert "MultiNetworkInterfacesInstancesValidator (public IPs)" not in report.not_checked


@pytest.mark.parametrize("itype", MULTI_NIC)
def test_a_multi_nic_queue_on_the_head_node_subnet_is_reported_with_the_fix(itype):
    report = validate_config(_config(itype, compute=HEAD))
    risk = [f for f in report.findings if f.source == "MultiNetworkInterfacesInstancesValidator"]
    assert [(f.level, f.path) for f in risk] == [("warning", "Scheduling/SlurmQueues[q]/Networking/SubnetIds")]
    assert HEAD in risk[0].message and "public IP" in risk[0].message
    assert "private subnet" in risk[0].fix and "--compute-subnet" in risk[0].fix


def test_assign_public_ip_on_a_multi_nic_queue_is_an_error_at_its_key():
    config = _config("p4d.24xlarge")
    config["Scheduling"]["SlurmQueues"][0]["Networking"]["AssignPublicIp"] = True
    assert ("Scheduling/SlurmQueues[q]/Networking/AssignPublicIp", "MultiNetworkInterfacesInstancesValidator") \
        in _errors(validate_config(config))


def test_config_with_one_subnet_warns_about_the_shared_subnet(tmp_path):
    res = run_hpc("cluster", "config", "--name", "demo", "--region", "us-east-1", "--subnet", HEAD, "--key-name",
                  "me", "--queue-spec", "p4d=p4d.24xlarge:2", "-o", str(tmp_path / "c.yaml"), "--json")
    assert res.returncode == 0, res.stderr
    warnings = cli_json(res)["warnings"]
    assert any("head node's subnet" in w and "SubnetIds" in w for w in warnings)
    assert "private, with a NAT gateway" in (tmp_path / "c.yaml").read_text()


def test_head_and_compute_subnets_land_where_they_belong(tmp_path):
    out = tmp_path / "c.yaml"
    res = run_hpc("cluster", "config", "--name", "demo", "--region", "us-east-1", "--head-subnet", HEAD,
                  "--compute-subnet", COMPUTE, "--key-name", "me", "--queue-spec", "p4d=p4d.24xlarge:2",
                  "--queue-spec", "cpu=c5.2xlarge:2", "-o", str(out))
    assert res.returncode == 0, res.stderr
    config = yaml.safe_load(out.read_text())
    assert config["HeadNode"]["Networking"]["SubnetId"] == HEAD
    assert [q["Networking"]["SubnetIds"] for q in config["Scheduling"]["SlurmQueues"]] == [[COMPUTE], [COMPUTE]]
    assert f"--head-subnet {HEAD} --compute-subnet {COMPUTE}" in out.read_text().splitlines()[1]


def test_a_missing_subnet_is_a_usage_error(tmp_path):
    res = run_hpc("cluster", "config", "--name", "demo", "--region", "us-east-1", "--head-subnet", HEAD,
                  "--key-name", "me", "--queue-spec", "p4d=p4d.24xlarge:2", "-o", str(tmp_path / "c.yaml"))
    assert res.returncode == 2 and "--compute-subnet" in res.stderr and not (tmp_path / "c.yaml").exists()


@pytest.mark.parametrize("option,value,path", [
    ("--custom-ami", "ami-0123", "Image/CustomAmi"),
    ("--region", "us-east-9", "Region"),
])
def test_config_checks_values_with_validates_rules_before_writing(option, value, path, tmp_path):
    out = tmp_path / "c.yaml"
    args = {"--subnet": HEAD, "--custom-ami": AMI, "--region": "us-east-1"} | {option: value}
    res = run_hpc("cluster", "config", "--name", "demo", "--key-name", "me", "--queue-spec", "p4d=p4d.24xlarge:2",
                  *[w for kv in args.items() for w in kv], "-o", str(out))
    assert res.returncode == 1 and not out.exists(), res.stderr
    assert f"{path}: " in res.stderr and "nothing was written" in res.stderr and "Traceback" not in res.stderr
    assert repr(value) in res.stderr and "fix:" in res.stderr  # the bad value, and how to fix it


def test_pattern_errors_show_the_value_and_the_fix_for_that_field():
    config = _config("c5.2xlarge")
    config["HeadNode"]["Networking"]["SubnetId"] = "subnet-0123"
    config["Image"]["CustomAmi"] = "ami-12"
    findings = {f.path: f for f in validate_config(config).findings if f.source == "schema"}
    subnet, ami = findings["HeadNode/Networking/SubnetId"], findings["Image/CustomAmi"]
    assert "'subnet-0123'" in subnet.message and "subnet-" in subnet.fix and "queue" not in subnet.fix
    assert "'ami-12'" in ami.message and "ami-" in ami.fix and "subnet" not in ami.fix


# ---- Capacity Blocks


def _block():
    return _config("p5.48xlarge", capacity_block=CR_ID)


def _block_cr(config):
    return config["Scheduling"]["SlurmQueues"][0]["ComputeResources"][0]


CR_PATH = "Scheduling/SlurmQueues[q]/ComputeResources[p5-48xlarge]"


def test_capacity_block_queue_is_written_as_pcluster_requires_and_validates():
    config = _block()
    queue = config["Scheduling"]["SlurmQueues"][0]
    resource = _block_cr(config)
    assert queue["CapacityType"] == "CAPACITY_BLOCK" and "AllocationStrategy" not in queue
    assert resource["MinCount"] == resource["MaxCount"] == 2
    assert resource["CapacityReservationTarget"] == {"CapacityReservationId": CR_ID}
    assert "Networking" not in resource and "PlacementGroup" not in json.dumps(queue)
    report = validate_config(config)
    assert report.valid and not [f for f in report.findings if f.level == "warning"], report.findings


BROKEN_BLOCKS = {
    "MinCount below MaxCount": (lambda c: _block_cr(c).update(MinCount=1), "error", f"{CR_PATH}/MaxCount",
                                "ComputeResourceSizeValidator"),
    "MinCount 0": (lambda c: _block_cr(c).update(MinCount=0), "error", f"{CR_PATH}/MinCount",
                   "ComputeResourceSizeValidator"),
    "no reservation id": (lambda c: _block_cr(c).pop("CapacityReservationTarget"), "error",
                          f"{CR_PATH}/CapacityReservationTarget", "hpc"),
    "AllocationStrategy": (lambda c: c["Scheduling"]["SlurmQueues"][0].update(AllocationStrategy="lowest-price"),
                           "error", "Scheduling/SlurmQueues[q]/AllocationStrategy", "hpc"),
    "placement group": (lambda c: _block_cr(c).update(Networking={"PlacementGroup": {"Enabled": True}}), "warning",
                        f"{CR_PATH}/Networking/PlacementGroup", "PlacementGroupCapacityTypeValidator"),
}


@pytest.mark.parametrize("rule", BROKEN_BLOCKS)
def test_each_broken_capacity_block_rule_is_caught_at_its_key_path(rule):
    change, level, path, source = BROKEN_BLOCKS[rule]
    config = _block()
    change(config)
    found = {(f.level, f.path, f.source) for f in validate_config(config).findings}
    assert (level, path, source) in found, found


def test_allocation_strategy_on_an_instances_list_is_left_to_pcluster():
    config = _block()
    resource = _block_cr(config)
    resource["Instances"] = [{"InstanceType": resource.pop("InstanceType")}]
    config["Scheduling"]["SlurmQueues"][0]["AllocationStrategy"] = "lowest-price"
    errors = _errors(validate_config(config))
    assert (CR_PATH, "InstancesAllocationStrategyValidator") in errors
    assert not any(source == "hpc" for _, source in errors)


def test_capacity_block_option_through_the_cli(tmp_path):
    out = tmp_path / "c.yaml"
    base = ["cluster", "config", "--name", "demo", "--region", "us-east-1", "--head-subnet", HEAD,
            "--compute-subnet", COMPUTE, "--key-name", "me", "--queue-spec", "p5=p5.48xlarge:2", "--queue-spec",
            "cpu=c5.2xlarge:2"]
    assert run_hpc(*base, "--capacity-block", f"p5={CR_ID}", "-o", str(out)).returncode == 0
    queues = yaml.safe_load(out.read_text())["Scheduling"]["SlurmQueues"]
    assert [q["CapacityType"] for q in queues] == ["CAPACITY_BLOCK", "ONDEMAND"]
    assert f"--capacity-block p5={CR_ID}" in out.read_text().splitlines()[1]
    for bad in (["--capacity-block", "cr-12"], ["--capacity-block", f"gpu={CR_ID}"],
                ["--capacity-block", f"p5={CR_ID}", "--capacity-reservation", f"p5={CR_ID}"]):
        res = run_hpc(*base, *bad, "-o", str(tmp_path / "x.yaml"))
        assert res.returncode == 2 and "fix:" in res.stderr and not (tmp_path / "x.yaml").exists(), bad


# ---- dl1, defaults


def test_dl1_without_custom_ami_is_an_error_at_config_time(tmp_path):
    res = run_hpc("cluster", "config", "--name", "demo", "--region", "us-east-1", "--subnet", HEAD, "--key-name",
                  "me", "--queue-spec", "gaudi=dl1.24xlarge:2", "-o", str(tmp_path / "c.yaml"))
    assert res.returncode == 1 and not (tmp_path / "c.yaml").exists()
    assert "Habana" in res.stderr and "--custom-ami" in res.stderr and "Traceback" not in res.stderr
    config = _config("dl1.24xlarge")
    config["Image"].pop("CustomAmi")
    assert ("Scheduling/SlurmQueues[q]/ComputeResources[dl1-24xlarge]/InstanceType", "hpc") in \
        _errors(validate_config(config))


def test_head_node_and_storage_defaults_are_set_and_commented():
    text = render(build_config(ClusterSpec(
        name="demo", region="us-east-1", head_subnet=HEAD, compute_subnet=COMPUTE, key_name="me",
        queues=(QueueSpec("gpu", "p4d.24xlarge", 2), QueueSpec("cpu", "c5.2xlarge", 2))))[0])
    config = yaml.safe_load(text)
    assert config["HeadNode"]["LocalStorage"]["RootVolume"]["Size"] == 100
    assert config["Scheduling"]["SlurmSettings"]["ScaledownIdletime"] == 30
    gpu, cpu = config["Scheduling"]["SlurmQueues"]
    assert gpu["ComputeSettings"]["LocalStorage"] == {"RootVolume": {"Size": 200},
                                                       "EphemeralVolume": {"MountDir": "/scratch"}}
    assert "ComputeSettings" not in cpu  # no instance store, no accelerator software
    for key in ("Size: 100", "Size: 200", "MountDir: /scratch", "ScaledownIdletime: 30"):
        line = next(line for line in text.splitlines() if key in line)
        assert "  # " in line, line  # each default says why it is set
    assert "8000 GB of NVMe" in text


# ---- published-style configs


def test_aws_minimal_style_config_is_valid():
    report = validate_file(DATA / "aws-minimal.yaml")
    assert report.valid and not [f for f in report.findings if f.level == "warning"], report.findings


def test_an_instance_type_outside_the_catalog_is_a_warning_naming_the_limited_checks():
    config = yaml.safe_load((DATA / "aws-minimal.yaml").read_text())
    resource = config["Scheduling"]["SlurmQueues"][0]["ComputeResources"][0]
    resource.update(InstanceType="x9.mega", Efa={"Enabled": True},
                    Networking={"PlacementGroup": {"Enabled": True}})
    report = validate_config(config)
    assert report.valid, _errors(report)
    [warning] = [f for f in report.findings if f.level == "warning"]
    assert warning.path.endswith("ComputeResources[c52xlarge]/InstanceType") and "EFA" in warning.message
    assert "x9.mega" in report.not_checked["EfaValidator"]
    # a known type in the same file is still checked: EFA on c5.2xlarge is an error
    resource.update(InstanceType="c5.2xlarge")
    assert any(source == "EfaValidator" for _, source in _errors(validate_config(config)))


def test_existing_fsx_file_systems_validate_and_are_listed_as_not_checked():
    report = validate_file(DATA / "existing-fsx.yaml")
    assert report.valid, _errors(report)
    assert "fs-0123456789abcdef0 (lustre)" in report.not_checked["existing FSx"]
    assert "fsvol-0123456789abcdef0 (zfs)" in report.not_checked["existing FSx"]
    assert "fsvol-0123456789abcdef1 (ontap)" in report.not_checked["existing FSx"]
    assert "fc-0123456789abcdef0 (cache)" in report.not_checked["existing FSx"]
    assert {"EfsIdValidator", "SharedEbsVolumeIdValidator", "MultiAzEbsVolumeValidator"} <= set(report.not_checked)
    text = (DATA / "existing-fsx.yaml").read_text().replace("MaxCount: 8", "MaxCount: 0")
    assert ("Scheduling/SlurmQueues[compute]/ComputeResources[c5-4xl]/MaxCount", "schema") in \
        _errors(validate_text(text))  # the rest of the file is still checked


def test_a_crashing_pcluster_validator_is_reported_as_failing_to_run_with_its_input():
    report = validate_file(DATA / "scratch2-throughput.yaml")
    crash = [f for f in report.findings if "failed to run" in f.message]
    assert len(crash) == 1 and crash[0].level == "warning" and crash[0].source == "FsxStorageTypeOptionsValidator"
    assert "KeyError" in crash[0].message and "deployment_type='SCRATCH_2'" in crash[0].message
    assert "per_unit_storage_throughput=200" in crash[0].message and "aws-parallelcluster" in crash[0].fix
    assert "FsxStorageTypeOptionsValidator" in report.not_checked
    # the user's real mistake is still an error of its own
    assert ("SharedStorage[scratch]/FsxLustreSettings/PerUnitStorageThroughput", "FsxPersistentOptionsValidator") \
        in _errors(report)


@pytest.mark.parametrize("region,fix", [("us-east-99", "us-east-1"),
                                        ("${AWS_REGION}", "export AWS_REGION=...; envsubst")])  # a template's
def test_an_unsupported_region_is_an_error_at_its_key(region, fix):
    config = yaml.safe_load((DATA / "aws-minimal.yaml").read_text())
    config["Region"] = region
    finding = next(f for f in validate_config(config).findings if f.path == "Region")
    assert finding.level == "error" and region in finding.message and fix in finding.fix


def test_wider_catalog_types_validate_in_a_generated_config():
    for itype in ("g5.12xlarge", "g6e.48xlarge", "trn1.32xlarge", "trn2.48xlarge", "hpc7a.96xlarge",
                  "hpc7g.16xlarge", "c7gn.16xlarge", "p5en.48xlarge", "p5.4xlarge", "p6-b300.48xlarge",
                  "p6e-gb200.36xlarge", "g7e.48xlarge", "g6e.24xlarge", "g5g.16xlarge",
                  "trn2u.48xlarge", "inf2.48xlarge", "dl2q.24xlarge", "c6in.32xlarge", "c7a.metal-48xl",
                  "hpc8a.96xlarge", "hpc7g.4xlarge"):
        config = _config(itype)
        if instance(itype).architecture == "arm64":  # Graviton, Grace: head node of the same architecture
            config["HeadNode"]["InstanceType"] = "c6gn.16xlarge"
        report = validate_config(config)
        assert report.valid, (itype, _errors(report))


# ---- the admin guide's commands (docs/admins.md), as written


def _readme_cluster_commands():
    section = (REPO / "docs" / "admins.md").read_text().split("## Cluster configs (admins)", 1)[1].split("\n## ", 1)[0]
    joined = re.sub(r"\\\n\s*", "", section)
    commands = []
    for line in joined.splitlines():
        line = line.strip().split("  #", 1)[0]
        if re.match(r"hpc cluster (config|validate|show)\b", line):
            commands.append(shlex.split(re.sub(r"\[([^\]]*)\]", r"\1", line))[1:])  # [--json] -> --json
    return commands


def test_readme_cluster_commands_run_as_written(tmp_path):
    commands = _readme_cluster_commands()
    assert [c[1] for c in commands] == ["config", "validate", "show"]
    for args in commands:
        res = run_hpc(*args, cwd=tmp_path)
        assert res.returncode == 0, (args, res.stdout, res.stderr)
    assert yaml.safe_load((tmp_path / "cluster.yaml").read_text())["Scheduling"]["SlurmQueues"]
