"""One set of instance checks for `hpc cluster config`, `queue add` and `queue set` (the catalog in any case, with
did-you-mean; EFA where the type has it; the head node's subnet under an EFA queue), a user's facts file for a type
the catalog lacks, `cluster show` of every compute resource, and edits that keep the file (issue 20)."""

import os
import shutil

import pytest
import yaml

from tests.conftest import REPO, cli_json, run_hpc, run_hpc_process
from toolkit.catalog import instance

AWS_STYLE = REPO / "tests" / "data" / "aws-style-cluster.yaml"  # cpu and train queues on the head node's subnet
HEAD_SUBNET = "subnet-0a1b2c3d4e5f60718"
PRIVATE = "subnet-0fedcba9876543210"
CONFIG = ("cluster", "config", "--name", "c1", "--region", "us-east-1", "--head-subnet", HEAD_SUBNET,
          "--compute-subnet", PRIVATE, "--key-name", "k")
# A real type the packaged catalog leaves out (g7.48xlarge: the EC2 specification tables the catalog cites give no
# G7 figures), as a user describes it. Its 2 network cards, one EFA each, are EC2's (EC2 User Guide: network cards,
# EFA limitations); the other figures are the test's own, not G7's.
USER_FACTS = {"instances": {"g7.48xlarge": {
    "accelerator": "nvidia", "gpus": 8, "gpu_model": "test GPU", "gpu_memory_gib": 32, "vcpus": 192, "cores": 96,
    "memory_gib": 1024, "network_gbps": 400, "network_cards": 2, "efa_interfaces": 2, "network_interfaces": 16,
    "gpudirect_rdma": True, "proprietary_driver": False, "instance_store_gb": 0}}}


def _copy(tmp_path, name="cluster.yaml"):
    path = tmp_path / name
    shutil.copyfile(AWS_STYLE, path)
    return path


def _queues(path):
    return {q["Name"]: q for q in yaml.safe_load(path.read_text())["Scheduling"]["SlurmQueues"]}


@pytest.mark.parametrize("command", ["config", "add", "set"])
def test_the_three_commands_refuse_a_typo_alike_and_accept_any_case(tmp_path, command):
    path = _copy(tmp_path)
    original = path.read_bytes()
    args = {"config": [*CONFIG, "-o", str(tmp_path / "new.yaml"), "--queue-spec", "gpu={t}:2"],
            "add": ["cluster", "queue", "add", str(path), "--queue-spec", "gpu={t}:2"],
            "set": ["cluster", "queue", "set", str(path), "cpu", "--instance", "{t}"]}[command]
    res = run_hpc(*[a.format(t="p4d.24xlarg") for a in args])
    assert res.returncode == 2 and "did you mean" in res.stderr and "p4d.24xlarge" in res.stderr, res.stderr
    assert path.read_bytes() == original and not (tmp_path / "new.yaml").exists()
    res = run_hpc(*[a.format(t="P4D.24XLarge") for a in args])
    assert res.returncode == 0, res.stderr
    written = _queues(tmp_path / "new.yaml" if command == "config" else path)
    types = {r.get("InstanceType") for q in written.values() for r in q["ComputeResources"]}
    assert "p4d.24xlarge" in types and "P4D.24XLarge" not in types  # the catalog's spelling is written


@pytest.mark.parametrize("command", ["config", "add"])
def test_a_queue_name_with_capitals_is_a_usage_error_in_both(tmp_path, command):
    args = ([*CONFIG, "-o", str(tmp_path / "new.yaml")] if command == "config" else
            ["cluster", "queue", "add", str(_copy(tmp_path))])
    res = run_hpc(*args, "--queue-spec", "Gpu=m5.xlarge:2")
    assert res.returncode == 2 and "queue name 'Gpu'" in res.stderr and "--queue-spec gpu=m5.xlarge:2" in res.stderr


@pytest.mark.parametrize("itype, facts", [
    ("p6-b200.48xlarge", (8, "B200", 8, 8, 3200)),
    ("p6-b300.48xlarge", (8, "B300", 17, 16, 6400)),
    ("p6e-gb200.36xlarge", (4, "B200", 17, 16, 3200)),
])
def test_the_p6_types_are_catalogued_with_their_efa(itype, facts):
    """EC2 Instance Types guide, accelerated computing specifications (GPUs, network cards, Gbps); one EFA per
    network card but none on card 0 of p6-b300 and p6e-gb200 (EC2 User Guide, efa-acc-inst-types)."""
    it = instance(itype)
    assert (it.gpus, it.gpu_model, it.network_cards, it.efa_interfaces, it.network_gbps) == facts
    assert it.has_efa and it.gpudirect_rdma and not it.proprietary_driver


def test_an_efa_queue_added_on_the_head_nodes_subnet_gets_efa_and_a_warning(tmp_path):
    path = _copy(tmp_path)
    data = cli_json(run_hpc("cluster", "queue", "add", str(path), "--queue-spec", "b200=p6-b200.48xlarge:2", "--json"))
    resource = _queues(path)["b200"]["ComputeResources"][0]
    assert resource["Efa"] == {"Enabled": True} and resource["Networking"]["PlacementGroup"]["Enabled"] is True
    assert _queues(path)["b200"]["Networking"]["SubnetIds"] == [HEAD_SUBNET]
    [warning] = data["warnings"]  # the queues already there had theirs: only the new queue's is new
    assert f"queue b200 uses the head node's subnet {HEAD_SUBNET}" in warning and "--subnet" in warning


def test_an_efa_queue_on_its_own_subnet_says_what_was_not_checked(tmp_path):
    path = _copy(tmp_path)
    data = cli_json(run_hpc("cluster", "queue", "add", str(path), "--queue-spec", "gpu=p5.48xlarge:2", "--subnet",
                            PRIVATE, "--json"))
    assert data["warnings"] == [] and _queues(path)["gpu"]["Networking"]["SubnetIds"] == [PRIVATE]
    assert [n for n in data["notes"] if n.startswith(f"not checked offline: whether subnet {PRIVATE} of queue gpu")]


def test_set_moves_a_queue_to_another_subnet_in_place(tmp_path):
    path = _copy(tmp_path)
    before = path.read_text().splitlines()
    data = cli_json(run_hpc("cluster", "queue", "set", str(path), "train", "--subnet", PRIVATE, "--json"))
    after = path.read_text().splitlines()
    assert data["changes"] == [f"train: Networking/SubnetIds [{HEAD_SUBNET}] -> [{PRIVATE}]"]
    assert [(a, b) for a, b in zip(before, after, strict=True) if a != b] == [
        (f"      SubnetIds: [{HEAD_SUBNET}]", f"      SubnetIds: [{PRIVATE}]")]


def test_set_to_a_type_with_efa_turns_efa_on(tmp_path):
    path = _copy(tmp_path)
    res = run_hpc("cluster", "queue", "set", str(path), "cpu", "--instance", "p5.48xlarge", "--subnet", PRIVATE)
    assert res.returncode == 0, res.stderr
    resource = _queues(path)["cpu"]["ComputeResources"][0]
    assert resource["Efa"] == {"Enabled": True} and resource["Networking"] == {"PlacementGroup": {"Enabled": True}}
    assert run_hpc("cluster", "validate", str(path)).returncode == 0


def test_a_type_outside_the_catalog_is_usable_through_the_users_facts_file(tmp_path):
    path = _copy(tmp_path)
    res = run_hpc("cluster", "queue", "add", str(path), "--queue-spec", "g7=g7.48xlarge:2")
    assert res.returncode == 2 and "HPC_INSTANCE_FACTS" in res.stderr and "instances.yaml" in res.stderr
    facts = tmp_path / "facts.yaml"
    facts.write_text(yaml.safe_dump(USER_FACTS))
    env = dict(os.environ, HPC_INSTANCE_FACTS=str(facts))
    res = run_hpc("cluster", "queue", "add", str(path), "--queue-spec", "g7=g7.48xlarge:2", "--subnet", PRIVATE,
                  env=env)
    assert res.returncode == 0, res.stderr
    assert _queues(path)["g7"]["ComputeResources"][0]["Efa"] == {"Enabled": True}
    rows = cli_json(run_hpc("cluster", "show", str(path), "--json", env=env))
    assert [(r["known"], r["gpus_per_node"], r["efa_interfaces"]) for r in rows if r["queue"] == "g7"] == [
        (True, 8, 2)]


@pytest.mark.parametrize("facts, words", [
    ({"instances": {"x9.huge": {**USER_FACTS["instances"]["g7.48xlarge"], "efa_interface": 4}}},
     "instances/x9.huge: unknown field 'efa_interface' (did you mean efa_interfaces?)"),
    ({"instances": {"x9.huge": {**USER_FACTS["instances"]["g7.48xlarge"], "gpus": "eight"}}},
     "instances/x9.huge: gpus must be a whole number"),
    ({"instances": {"p5.48xlarge": USER_FACTS["instances"]["g7.48xlarge"]}},
     "p5.48xlarge is already in the toolkit's catalog"),
    ({"g7.48xlarge": {}}, "an instance facts file is a mapping with an `instances:` mapping"),
])
def test_a_bad_facts_file_is_one_error_naming_it(tmp_path, facts, words):
    path = _copy(tmp_path)
    original = path.read_bytes()
    (tmp_path / "facts.yaml").write_text(yaml.safe_dump(facts))
    res = run_hpc("cluster", "queue", "add", str(path), "--queue-spec", "x=m5.xlarge:2",
                  env=dict(os.environ, HPC_INSTANCE_FACTS=str(tmp_path / "facts.yaml")))
    assert res.returncode == 1 and f"{tmp_path / 'facts.yaml'}: " in res.stderr and words in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and path.read_bytes() == original


def test_show_lists_every_compute_resource_and_tolerates_unknown_types(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(AWS_STYLE.read_text().replace("InstanceType: p4de.24xlarge", "InstanceType: x9.huge"))
    res = run_hpc("cluster", "show", str(path), "--json")
    assert res.returncode == 0, res.stderr
    rows = [(r["queue"], r["compute_resource"], r["instance_type"], r["known"], r["gpus_per_node"], r["max_nodes"])
            for r in cli_json(res)]
    assert rows == [("cpu", "cpu-large", "c5.18xlarge", True, 0, 16), ("train", "p4d", "p4d.24xlarge", True, 8, 4),
                    ("train", "p4de", "x9.huge", False, None, 2)]
    text = run_hpc("cluster", "show", str(path))
    assert text.returncode == 0 and "x9.huge        unknown" in text.stdout and "instances.yaml" in text.stderr


def test_set_on_a_symlinked_config_edits_the_file_it_points_to(tmp_path):
    (tmp_path / "real").mkdir()
    target = _copy(tmp_path / "real")
    link = tmp_path / "cluster.yaml"
    link.symlink_to(target)
    assert run_hpc("cluster", "queue", "set", str(link), "cpu", "--max", "3").returncode == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert _queues(target)["cpu"]["ComputeResources"][0]["MaxCount"] == 3


def test_remove_keeps_the_blank_line_before_the_next_section(tmp_path):
    path = tmp_path / "cluster.yaml"
    text = AWS_STYLE.read_text()
    text = text.replace("  # GPU training queue: EFA in one placement group\n", "").replace(
        "      - subnet-0a1b2c3d4e5f60718\n\n", "      - subnet-0a1b2c3d4e5f60718\n").replace(
        "    JobExclusiveAllocation: true\nSharedStorage:", "    JobExclusiveAllocation: true\n\nSharedStorage:")
    path.write_text(text)
    assert run_hpc("cluster", "queue", "remove", str(path), "train").returncode == 0
    assert "      - subnet-0a1b2c3d4e5f60718\n\nSharedStorage:\n" in path.read_text()


def test_set_with_the_values_the_file_has_is_a_no_op(tmp_path):
    path = _copy(tmp_path)
    original, mtime = path.read_bytes(), path.stat().st_mtime_ns
    res = run_hpc("cluster", "queue", "set", str(path), "cpu", "--max", "16", "--instance", "c5.18xlarge")
    assert res.returncode == 0 and "queue cpu already has these values: the file was not changed" in res.stdout
    assert path.read_bytes() == original and path.stat().st_mtime_ns == mtime


def test_pcluster_log_records_become_our_warnings_not_raw_stderr(tmp_path):
    """pcluster logs on the root logger when it cannot cache capacity reservations (a resource group, offline);
    a process of its own, since pytest's log capture would hide a raw record in-process."""
    config = yaml.safe_load(AWS_STYLE.read_text())
    train = config["Scheduling"]["SlurmQueues"][1]
    train["ComputeResources"][0]["CapacityReservationTarget"] = {
        "CapacityReservationResourceGroupArn": "arn:aws:resource-groups:us-east-1:000000000000:group/g"}
    train["Networking"]["PlacementGroup"]["Enabled"] = False
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    res = run_hpc_process("cluster", "queue", "set", str(path), "cpu", "--max", "3")
    assert res.returncode == 0 and "WARNING:root" not in res.stderr and "WARNING" not in res.stderr, res.stderr
    findings = cli_json(run_hpc("cluster", "validate", str(path), "--json"))["findings"]
    assert [f["level"] for f in findings if "pcluster logged" in f["message"]] == ["warning"]


def test_a_job_can_use_a_queue_beside_one_of_an_uncatalogued_type(tmp_path):
    """The job side reads every queue of the cluster's config; a queue of a type outside the catalog stops only the
    jobs that need its facts."""
    from toolkit.cluster.queues import queues_from_config
    from toolkit.errors import HpcError

    config = yaml.safe_load(AWS_STYLE.read_text())
    config["Scheduling"]["SlurmQueues"][1]["ComputeResources"][0]["InstanceType"] = "p4d.24xlarg"  # an EFA queue
    queues = queues_from_config(config)
    assert queues["cpu"].cpus_per_node == 72
    with pytest.raises(HpcError) as err:
        _ = queues["train"].gpus_per_node
    assert "did you mean p4d.24xlarge?" in err.value.fix


def test_every_ec2_type_is_known_offline_from_botocores_model():
    from toolkit.catalog import catalog, ec2_type_names, suggestion

    names = ec2_type_names()
    assert {"c6i.32xlarge", "hpc7a.96xlarge", "p5en.48xlarge", "trn2.48xlarge"} <= names
    assert sorted(set(catalog()) - names) == []  # the catalog holds real types only
    assert suggestion("c6i.32xlarge") is None  # a real type: nothing to correct
    assert suggestion("c6i.32xlarg") == "c6i.32xlarge" and suggestion("C6I.32XLARGE") == "c6i.32xlarge"


def test_a_typo_gets_the_closest_real_type_not_a_catalogued_lookalike(tmp_path):
    path = _copy(tmp_path)
    original = path.read_bytes()
    res = run_hpc("cluster", "queue", "set", str(path), "cpu", "--instance", "c6a.48xlarg")
    assert res.returncode == 2
    assert "instance type 'c6a.48xlarg' is not in the toolkit's catalog nor among EC2's instance types" in res.stderr
    assert "did you mean --instance c6a.48xlarge?" in res.stderr and "c7a.48xlarge" not in res.stderr
    assert path.read_bytes() == original


def test_a_real_cpu_type_the_catalog_lacks_is_accepted_with_one_note(tmp_path):
    path = _copy(tmp_path)
    res = run_hpc("cluster", "queue", "set", str(path), "cpu", "--instance", "c6a.48xlarge")
    assert res.returncode == 0, res.stderr
    resource = _queues(path)["cpu"]["ComputeResources"][0]
    assert resource["InstanceType"] == "c6a.48xlarge" and "Efa" not in resource  # nothing says it has EFA
    # what is unknown is said once: the validation's warning, naming the facts file to fill in
    assert res.stderr.count("c6a.48xlarge") == 1, res.stderr
    assert "'c6a.48xlarge' is a real EC2 type the toolkit's catalog lacks: its vCPUs, cores, memory and EFA are " \
           "unknown here" in res.stderr and "instances.yaml" in res.stderr


def test_a_real_gpu_type_the_catalog_lacks_is_refused_for_a_gpu_queue_with_the_fix(tmp_path):
    path = _copy(tmp_path)
    original = path.read_bytes()
    res = run_hpc("cluster", "queue", "set", str(path), "train", "--compute-resource", "p4d", "--instance",
                  "g7.48xlarge")
    assert res.returncode == 2 and path.read_bytes() == original
    assert ("g7.48xlarge is a real EC2 instance type the toolkit's catalog lacks; its accelerators per node and "
            "EFA interfaces, which a GPU (accelerator) queue needs, are unknown here") in res.stderr
    assert "fix: put the type's facts in ~/.config/hpc/instances.yaml" in res.stderr
    # with the user's facts for it, the same edit goes through (and gets EFA)
    facts = tmp_path / "facts.yaml"
    facts.write_text(yaml.safe_dump(USER_FACTS))
    res = run_hpc("cluster", "queue", "set", str(path), "train", "--compute-resource", "p4d", "--instance",
                  "g7.48xlarge", env=dict(os.environ, HPC_INSTANCE_FACTS=str(facts)))
    assert res.returncode == 0, res.stderr
