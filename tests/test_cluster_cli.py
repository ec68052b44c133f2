"""`hpc cluster config | validate | show` through the real CLI."""

import shlex
import subprocess
import sys

import pytest
import yaml

from tests.conftest import cli_json, REPO, run_hpc, run_hpc_process

BASE = ["cluster", "config", "--name", "demo", "--region", "us-east-1", "--subnet", "subnet-0123456789abcdef0",
        "--key-name", "my-key"]
EXAMPLES = sorted((REPO / "cluster-configs").glob("*.yaml"))


def test_examples_regenerate_byte_identical(tmp_path):
    subprocess.run([sys.executable, str(REPO / "cluster-configs" / "regenerate.py"), "--into", str(tmp_path)],
                   check=True, capture_output=True)
    assert len(EXAMPLES) >= 2
    for example in EXAMPLES:
        assert (tmp_path / "cluster-configs" / example.name).read_bytes() == example.read_bytes(), example.name


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_passes_validate(example):
    res = run_hpc("cluster", "validate", str(example), "--json")
    assert res.returncode == 0, res.stdout
    assert cli_json(res)["valid"] is True


def test_examples_hold_no_account_ids_or_secrets():
    for example in EXAMPLES:
        text = example.read_text()
        assert "arn:aws" not in text and "AKIA" not in text
        assert not any(word.isdigit() and len(word) == 12 for word in text.replace(":", " ").split())


def test_same_input_gives_the_same_bytes(tmp_path):
    args = [*BASE, "--queue-spec", "gpu=p4d.24xlarge:2", "--queue-spec", "cpu=c5.18xlarge:4,ranks-per-node=8",
            "--fsx-import", "s3://my-bucket/data"]
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    assert run_hpc(*args, "-o", "x.yaml", cwd=tmp_path).returncode == 0
    first.write_bytes((tmp_path / "x.yaml").read_bytes())
    assert run_hpc(*args, "-o", "x.yaml", "--force", cwd=tmp_path).returncode == 0
    second.write_bytes((tmp_path / "x.yaml").read_bytes())
    assert first.read_bytes() == second.read_bytes()


def test_generated_config_has_the_expected_shape(tmp_path):
    out = tmp_path / "c.yaml"
    res = run_hpc(*BASE, "--queue-spec", "gpu=p4d.24xlarge:2", "--queue-spec", "cpu=c5.18xlarge:4,ranks-per-node=8",
                  "--fsx-deployment", "PERSISTENT_2", "--fsx-import", "s3://my-bucket/data", "-o", str(out))
    assert res.returncode == 0, res.stderr
    config = yaml.safe_load(out.read_text())
    gpu, cpu = config["Scheduling"]["SlurmQueues"]
    resource = gpu["ComputeResources"][0]
    assert resource["MinCount"] == 0 and resource["Efa"] == {"Enabled": True}
    assert resource["Networking"]["PlacementGroup"]["Enabled"] is True
    assert "GdrSupport" not in out.read_text()
    assert gpu["JobExclusiveAllocation"] is True and "JobExclusiveAllocation" not in cpu
    assert "Efa" not in cpu["ComputeResources"][0]
    assert {"Key": "hpc:ranks-per-node", "Value": "8"} in cpu["Tags"]
    fsx = config["SharedStorage"][0]["FsxLustreSettings"]
    assert "ImportPath" not in fsx and fsx["DataRepositoryAssociations"][0]["DataRepositoryPath"] == \
        "s3://my-bucket/data"
    assert run_hpc("cluster", "validate", str(out)).returncode == 0


def test_v100_without_custom_ami_stops_with_the_fix(tmp_path):
    res = run_hpc(*BASE, "--queue-spec", "p3dn=p3dn.24xlarge:2", "-o", str(tmp_path / "c.yaml"))
    assert res.returncode == 1 and not (tmp_path / "c.yaml").exists()
    assert "OpenRM" in res.stderr and "--custom-ami" in res.stderr and "Traceback" not in res.stderr


def test_v100_with_custom_ami_warns_and_comments(tmp_path):
    out = tmp_path / "c.yaml"
    res = run_hpc(*BASE, "--queue-spec", "p3=p3.16xlarge:2", "--custom-ami", "ami-0123456789abcdef0", "-o", str(out))
    assert res.returncode == 0
    assert "warning: V100 trap" in res.stderr
    assert "# V100 trap" in out.read_text() and "InstanceTypeBaseAMICompatibleValidator" in out.read_text()


def test_existing_output_needs_force(tmp_path):
    out = tmp_path / "c.yaml"
    out.write_text("keep me\n")
    res = run_hpc(*BASE, "--queue-spec", "cpu=c5.18xlarge:2", "-o", str(out))
    assert res.returncode == 1 and "--force" in res.stderr and out.read_text() == "keep me\n"
    assert run_hpc(*BASE, "--queue-spec", "cpu=c5.18xlarge:2", "-o", str(out), "--force").returncode == 0
    assert out.read_text().startswith("# ParallelCluster v3 config")


def test_reservation_turns_the_placement_group_off_and_says_why(tmp_path):
    out = tmp_path / "c.yaml"
    assert run_hpc(*BASE, "--queue-spec", "p5=p5.48xlarge:2", "--capacity-reservation", "cr-0123456789abcdef0",
                   "-o", str(out)).returncode == 0
    resource = yaml.safe_load(out.read_text())["Scheduling"]["SlurmQueues"][0]["ComputeResources"][0]
    assert resource["CapacityReservationTarget"] == {"CapacityReservationId": "cr-0123456789abcdef0"}
    assert resource["Networking"]["PlacementGroup"]["Enabled"] is False
    assert "placement group conflict" in out.read_text()


@pytest.mark.parametrize("args", [
    ["--queue-spec", "gpu"], ["--queue-spec", "GPU=p4d.24xlarge:2"], ["--queue-spec", "gpu=p4d.24xlarge:0"],
    ["--queue-spec", "gpu=p4d.24xlarge:2,ranks-per-node=4"],
    ["--queue-spec", "cpu=c5.18xlarge:2", "--fsx-capacity", "1000"],
    ["--queue-spec", "cpu=c5.18xlarge:2", "--os", "alinux2"],
    ["--queue-spec", "a=p4d.24xlarge:1", "--queue-spec", "b=p5.48xlarge:1",
     "--capacity-reservation", "cr-0123456789abcdef0"],
])
def test_bad_options_are_usage_errors(args, tmp_path):
    res = run_hpc(*BASE, *args, "-o", str(tmp_path / "c.yaml"))
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error:") and "fix:" in res.stderr and "Traceback" not in res.stderr


def test_validate_reports_findings_and_exit_codes(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLES[0].read_text().replace("MinCount: 0", "MinCount: 20"))
    res = run_hpc("cluster", "validate", str(bad))
    assert res.returncode == 1 and "INVALID" in res.stdout
    assert "ComputeResources[p3dn-24xlarge]/MaxCount" in res.stdout and "not checked offline" in res.stdout
    report = cli_json(run_hpc("cluster", "validate", str(bad), "--json"))
    finding = next(f for f in report["findings"] if f["level"] == "error")
    assert set(finding) >= {"level", "file", "line", "path", "message", "fix"}


@pytest.mark.parametrize("text", ["a: [\n", "", "- x\n", "a: 1\na: 2\n"])
def test_validate_malformed_input_exits_1_without_traceback(text, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    res = run_hpc("cluster", "validate", str(bad))
    assert res.returncode == 1 and "Traceback" not in res.stdout + res.stderr


def test_validate_missing_file(tmp_path):
    res = run_hpc("cluster", "validate", str(tmp_path / "none.yaml"))
    assert res.returncode == 1 and "does not exist" in res.stderr


def test_validate_without_pcluster_says_how_to_install(tmp_path):
    blocker = tmp_path / "sitecustomize.py"  # hide aws-parallelcluster from this one process
    blocker.write_text("import sys\nclass Hide:\n    def find_spec(self, name, path=None, target=None):\n"
                       "        if name == 'pcluster' or name.startswith('pcluster.'):\n"
                       "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
                       "sys.meta_path.insert(0, Hide())\n")
    import os
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    res = run_hpc_process("cluster", "validate", str(EXAMPLES[0]), env=env)
    assert res.returncode == 1 and "pip install 'hpc-toolkit[admin]'" in res.stderr


def test_show_lists_queues(tmp_path):
    res = run_hpc("cluster", "show", str(REPO / "cluster-configs" / "p3dn-efa-fsx.yaml"), "--json")
    rows = {r["queue"]: r for r in cli_json(res)}
    assert rows["p3dn"] | {} == rows["p3dn"] and rows["p3dn"]["gpus_per_node"] == 8
    assert (rows["p3dn"]["efa_interfaces"], rows["p3dn"]["max_nodes"], rows["p3dn"]["fsx_mount"]) == (1, 8, "/fsx")
    assert (rows["cpu"]["gpus_per_node"], rows["cpu"]["tasks_per_node"]) == (0, 36)
    text = run_hpc("cluster", "show", str(REPO / "cluster-configs" / "p5-reservation.yaml")).stdout
    assert "p5.48xlarge" in text and "8 x H100" in text and " 32 " in text


def test_show_without_file_off_a_head_node():
    res = run_hpc("cluster", "show")
    assert res.returncode == 1 and "/opt/parallelcluster/shared/cluster-config.yaml" in res.stderr


def test_recorded_commands_are_the_ones_in_the_headers():
    for example in EXAMPLES:
        line = example.read_text().splitlines()[1]
        assert shlex.split(line.lstrip("# "))[-1] == f"cluster-configs/{example.name}"
