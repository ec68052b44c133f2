"""What `hpc cluster config` writes by default for a real cluster, and the hand-written jobs/*-cluster.yaml, through
aws-parallelcluster 3.16.1's own schema and validators (`hpc cluster validate`, offline): GPU health checks on
NVIDIA queues, a managed FSx that outlives the cluster, FSx sized for a throughput, SSH not open to the internet,
and the Gaudi AMI made by `pcluster build-image`."""


import pytest
import yaml

from tests.conftest import cli_json, REPO, run_hpc
from toolkit.catalog import instance
from toolkit.cluster.validate import validate_file

BASE = ["cluster", "config", "--name", "demo", "--region", "us-east-1", "--head-subnet", "subnet-0123456789abcdef0",
        "--compute-subnet", "subnet-0a1b2c3d4e5f67890", "--key-name", "my-key"]
JOB_CLUSTERS = sorted((REPO / "jobs").glob("*-cluster.yaml"))


def _config(tmp_path, *args: str) -> tuple[dict, dict]:
    """(the written config, `hpc cluster config --json`'s answer); the file must pass `hpc cluster validate`."""
    out = tmp_path / "c.yaml"
    res = run_hpc(*BASE, *args, "-o", str(out), "--json")
    assert res.returncode == 0, res.stderr
    valid = run_hpc("cluster", "validate", str(out), "--json")
    assert valid.returncode == 0 and cli_json(valid)["valid"], valid.stdout
    return yaml.safe_load(out.read_text()), cli_json(res)


def _queues(config: dict) -> dict[str, dict]:
    return {q["Name"]: q for q in config["Scheduling"]["SlurmQueues"]}


def test_nvidia_queues_get_pclusters_gpu_health_check_and_the_others_none(tmp_path):
    config, _ = _config(tmp_path, "--queue-spec", "gpu=p4d.24xlarge:4", "--queue-spec", "cpu=c5n.18xlarge:2",
                        "--queue-spec", "gaudi=dl1.24xlarge:2", "--custom-ami", "ami-0123456789abcdef0")
    queues = _queues(config)
    assert queues["gpu"]["HealthChecks"] == {"Gpu": {"Enabled": True}}
    assert "HealthChecks" not in queues["cpu"] and "HealthChecks" not in queues["gaudi"]  # DCGM is NVIDIA's


def test_the_managed_fsx_is_retained_when_the_cluster_goes(tmp_path):
    config, _ = _config(tmp_path, "--queue-spec", "gpu=p4d.24xlarge:2", "--fsx-capacity", "2400")
    assert config["SharedStorage"][0]["FsxLustreSettings"]["DeletionPolicy"] == "Retain"
    report = validate_file(tmp_path / "c.yaml")  # pcluster's DeletionPolicyValidator reads it back
    assert any("DeletionPolicy is set to Retain" in f.message for f in report.findings), report.findings


@pytest.mark.parametrize("args,capacity,per_unit", [
    # SCRATCH_2 gives 200 MB/s per TiB: 2000 MB/s needs 10 TiB, i.e. 12000 GiB (1200, then steps of 2400)
    (["--fsx-throughput", "2000"], 12000, None),
    # PERSISTENT_2 at its 1000 MB/s/TiB tier: 6000 MB/s needs 6 TiB, i.e. 7200 GiB
    (["--fsx-deployment", "PERSISTENT_2", "--fsx-throughput", "6000"], 7200, 1000),
    # a given capacity is kept; the lowest tier that reaches the throughput on it: 2400 GiB x 250 = 585 MB/s
    (["--fsx-deployment", "PERSISTENT_2", "--fsx-capacity", "2400", "--fsx-throughput", "500"], 2400, 250),
    (["--fsx-deployment", "PERSISTENT_2", "--fsx-capacity", "2400"], 2400, 125),
])
def test_fsx_is_sized_for_the_throughput_asked(tmp_path, args, capacity, per_unit):
    config, _ = _config(tmp_path, "--queue-spec", "gpu=p4d.24xlarge:8", *args)
    fsx = config["SharedStorage"][0]["FsxLustreSettings"]
    assert (fsx["StorageCapacity"], fsx.get("PerUnitStorageThroughput")) == (capacity, per_unit)


def test_an_unsized_fsx_under_accelerators_says_its_throughput(tmp_path):
    config, answer = _config(tmp_path, "--queue-spec", "gpu=p4d.24xlarge:8", "--fsx-capacity", "1200")
    assert config["SharedStorage"][0]["FsxLustreSettings"]["StorageCapacity"] == 1200
    assert any("234 MB/s baseline" in w and "64 accelerators" in w and "--fsx-throughput" in w
               for w in answer["warnings"]), answer["warnings"]
    assert "about 234 MB/s baseline" in (tmp_path / "c.yaml").read_text()


def test_ssh_is_not_open_to_the_internet_by_default(tmp_path):
    config, _ = _config(tmp_path, "--queue-spec", "cpu=c5n.18xlarge:2")
    assert config["HeadNode"]["Ssh"]["AllowedIps"] == "10.0.0.0/8"  # ParallelCluster's own default: 0.0.0.0/0
    config, _ = _config(tmp_path, "--queue-spec", "cpu=c5n.18xlarge:2", "--ssh-allowed-ips", "203.0.113.7/32",
                        "--force")
    assert config["HeadNode"]["Ssh"]["AllowedIps"] == "203.0.113.7/32"
    assert "--ssh-allowed-ips 203.0.113.7/32" in (tmp_path / "c.yaml").read_text()  # the recorded command
    _, answer = _config(tmp_path, "--queue-spec", "cpu=c5n.18xlarge:2", "--ssh-allowed-ips", "0.0.0.0/0", "--force")
    assert any("whole internet" in w for w in answer["warnings"]), answer["warnings"]
    res = run_hpc(*BASE, "--queue-spec", "cpu=c5n.18xlarge:2", "--ssh-allowed-ips", "my-laptop",
                  "-o", str(tmp_path / "bad.yaml"))
    assert res.returncode == 2 and "neither a CIDR nor a prefix list" in res.stderr


def test_a_gaudi_ami_is_said_to_come_from_pcluster_build_image(tmp_path):
    _config(tmp_path, "--queue-spec", "gaudi=dl1.24xlarge:2", "--custom-ami", "ami-0123456789abcdef0")
    line = next(t for t in (tmp_path / "c.yaml").read_text().splitlines() if "CustomAmi:" in t)
    assert "pcluster build-image" in line and "ParentImage" in line


@pytest.mark.parametrize("path", JOB_CLUSTERS, ids=lambda p: p.name)
def test_the_job_clusters_have_the_same_defaults_and_pass_validate(path):
    res = run_hpc("cluster", "validate", str(path), "--json")
    assert res.returncode == 0 and cli_json(res)["valid"], res.stdout
    config = yaml.safe_load(path.read_text())
    assert config["HeadNode"]["Ssh"]["AllowedIps"] != "0.0.0.0/0"
    assert config["SharedStorage"][0]["FsxLustreSettings"]["DeletionPolicy"] == "Retain"
    for queue in config["Scheduling"]["SlurmQueues"]:
        itype = queue["ComputeResources"][0]["Instances"][0]["InstanceType"]
        assert ("HealthChecks" in queue) == instance(itype).is_gpu, queue["Name"]
    if any("HealthChecks" in queue for queue in config["Scheduling"]["SlurmQueues"]):
        from toolkit.cluster.build import BATCH_START_TIMEOUT_S, PROLOG_TIMEOUT_S

        assert _custom_slurm_settings(config) == {"BatchStartTimeout": BATCH_START_TIMEOUT_S,
                                                  "PrologEpilogTimeout": PROLOG_TIMEOUT_S}


def test_the_dl1_cluster_asks_for_an_ami_built_from_the_habana_dlami():
    text = (REPO / "jobs" / "dl1-cluster.yaml").read_text()
    assert "pcluster build-image" in text and "ParentImage" in text


def _custom_slurm_settings(config: dict) -> dict:
    settings = config["Scheduling"]["SlurmSettings"].get("CustomSlurmSettings") or []
    return {key: value for item in settings for key, value in item.items()}


def test_gpu_health_checks_come_with_prolog_time_limits_pcluster_accepts(tmp_path):
    # aws-parallelcluster#6777: the DCGM check in each job's prolog can outlast ParallelCluster's BatchStartTimeout
    # (180 s) on p4d/p5; a hung prolog is bounded by PrologEpilogTimeout (Slurm waits forever by default)
    from toolkit.cluster.build import BATCH_START_TIMEOUT_S, PROLOG_TIMEOUT_S

    config, _ = _config(tmp_path, "--queue-spec", "gpu=p5.48xlarge:2", "--queue-spec", "cpu=c5n.18xlarge:2")
    assert _queues(config)["gpu"]["HealthChecks"] == {"Gpu": {"Enabled": True}}
    settings = _custom_slurm_settings(config)
    assert settings == {"BatchStartTimeout": BATCH_START_TIMEOUT_S, "PrologEpilogTimeout": PROLOG_TIMEOUT_S}
    # ParallelCluster's health check manager stops a check at 600 s; the prolog limit lies above it, and the batch
    # start limit above that
    assert 600 < PROLOG_TIMEOUT_S < BATCH_START_TIMEOUT_S < 2 ** 16  # slurm.conf reads both as uint16
    (tmp_path / "cpu").mkdir()
    cpu_only, _ = _config(tmp_path / "cpu", "--queue-spec", "cpu=c5n.18xlarge:2")
    assert "CustomSlurmSettings" not in cpu_only["Scheduling"]["SlurmSettings"]


def test_the_prolog_time_limits_are_not_on_pclusters_deny_list():
    # aws-parallelcluster 3.16.1 pcluster/validators/slurm_settings_validator.py: the keys ParallelCluster manages
    # itself (Prolog, Epilog, SlurmctldParameters, ...) are refused in CustomSlurmSettings
    from pcluster.validators.slurm_settings_validator import SLURM_SETTINGS_DENY_LIST

    denied = {key for keys in SLURM_SETTINGS_DENY_LIST["SlurmConf"].values() for key in keys}
    assert {"prolog", "epilog", "slurmctldparameters"} <= denied
    assert not {"batchstarttimeout", "prologepilogtimeout"} & denied


def test_pclusters_own_validator_reads_the_generated_custom_slurm_settings(tmp_path):
    # the offline path runs CustomSlurmSettingsValidator: a denied key planted next to ours is an error there, ours not
    from toolkit.cluster.validate import validate_config

    config, _ = _config(tmp_path, "--queue-spec", "gpu=p4d.24xlarge:2")
    ours = [f for f in validate_config(config).findings if "CustomSlurmSettings" in f.path or "Slurm" in f.source]
    assert not [f for f in ours if f.level == "error"], ours
    config["Scheduling"]["SlurmSettings"]["CustomSlurmSettings"].append({"Prolog": "/opt/mine/*"})
    errors = [f for f in validate_config(config).findings if f.level == "error"]
    assert any(f.source == "CustomSlurmSettingsValidator" and "Prolog" in f.message for f in errors), errors
