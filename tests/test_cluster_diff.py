"""`hpc cluster diff OLD NEW` against ParallelCluster's own ConfigPatch.check() as the oracle: for every kind of
change and both fleet states, our CLI's verdict, policy names and check results equal pcluster's on the same pair."""

import copy
import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from tests.conftest import cli_json, REPO, run_hpc

P5 = yaml.safe_load((REPO / "cluster-configs" / "p5-reservation.yaml").read_text())
AWS_STYLE = yaml.safe_load((REPO / "tests" / "data" / "aws-style-cluster.yaml").read_text())


def _queue(config, name):
    return next(q for q in config["Scheduling"]["SlurmQueues"] if q["Name"] == name)


def _cr(config, queue, index=0):
    return _queue(config, queue)["ComputeResources"][index]


def _set(**changes):
    """A mutation: key path ('a/b/c', list items as Name) -> new value (None removes the key)."""
    def mutate(config):
        for path, value in changes.items():
            node = config
            *parents, last = path.split("/")
            for part in parents:
                node = next(i for i in node if i.get("Name") == part) if isinstance(node, list) else \
                    node.setdefault(part, {})
            if value is None:
                node.pop(last)
            else:
                node[last] = value
    return mutate


def _at(config, path):
    """The node at a key path ('a/b/c', list items as Name)."""
    node = config
    for part in path.split("/"):
        node = next(i for i in node if i.get("Name") == part) if isinstance(node, list) else node[part]
    return node


def _append(path, item):
    def mutate(config):
        _at(config, path).append(copy.deepcopy(item))
    return mutate


def _drop(path, name):
    def mutate(config):
        node = _at(config, path)
        node[:] = [i for i in node if i.get("Name") != name]
    return mutate


NEW_QUEUE = {"Name": "extra", "CapacityType": "ONDEMAND",
             "Networking": {"SubnetIds": ["subnet-0fedcba9876543210"]},
             "ComputeResources": [{"Name": "m5", "InstanceType": "m5.xlarge", "MinCount": 0, "MaxCount": 4}]}
NEW_CR = {"Name": "c5", "InstanceType": "c5.18xlarge", "MinCount": 0, "MaxCount": 2}
EFS = {"Name": "efs", "StorageType": "Efs", "MountDir": "/efs", "EfsSettings": {"FileSystemId": "fs-0123456789abcdef0"}}
EBS = {"Name": "scratch", "StorageType": "Ebs", "MountDir": "/scratch", "EbsSettings": {"Size": 100}}
CR_P5 = "Scheduling/SlurmQueues/p5/ComputeResources/p5-48xlarge"
CR_CPU = "Scheduling/SlurmQueues/cpu/ComputeResources/m5-8xlarge"

# kind -> (base config, mutation giving OLD, mutation giving NEW)
KINDS = {
    "max-count-up": (P5, None, _set(**{f"{CR_P5}/MaxCount": 8})),
    "max-count-down": (P5, None, _set(**{f"{CR_P5}/MaxCount": 2})),
    "min-count-up": (P5, None, _set(**{f"{CR_CPU}/MinCount": 1})),
    "min-and-max-count-up": (P5, None, _set(**{f"{CR_CPU}/MinCount": 2, f"{CR_CPU}/MaxCount": 4})),
    "instance-type": (P5, None, _set(**{f"{CR_CPU}/InstanceType": "c5.18xlarge"})),
    "instance-type-with-drain": (P5, None, _set(**{f"{CR_CPU}/InstanceType": "c5.18xlarge",
                                                    "Scheduling/SlurmSettings/QueueUpdateStrategy": "DRAIN"})),
    "add-queue": (P5, None, _append("Scheduling/SlurmQueues", NEW_QUEUE)),
    "remove-queue": (P5, None, _drop("Scheduling/SlurmQueues", "cpu")),
    "add-compute-resource": (P5, None, _append("Scheduling/SlurmQueues/cpu/ComputeResources", NEW_CR)),
    "remove-compute-resource": (P5, _append("Scheduling/SlurmQueues/cpu/ComputeResources", NEW_CR), None),
    "head-node-type": (P5, None, _set(**{"HeadNode/InstanceType": "c5n.9xlarge"})),
    "shared-storage-add-external-efs": (P5, None, _append("SharedStorage", EFS)),
    "shared-storage-add-managed-ebs": (P5, None, _append("SharedStorage", EBS)),
    "shared-storage-remove-managed-fsx": (P5, None, _drop("SharedStorage", "fsx")),
    "placement-group": (P5, None, _set(**{f"{CR_P5}/Networking/PlacementGroup/Enabled": True})),
    "capacity-reservation": (P5, None, _set(**{
        f"{CR_P5}/CapacityReservationTarget/CapacityReservationId": "cr-0fedcba9876543210"})),
    "capacity-reservation-with-drain": (P5, None, _set(**{
        f"{CR_P5}/CapacityReservationTarget/CapacityReservationId": "cr-0fedcba9876543210",
        "Scheduling/SlurmSettings/QueueUpdateStrategy": "DRAIN"})),
    "remove-queue-with-terminate": (P5, None, lambda c: (
        _drop("Scheduling/SlurmQueues", "cpu")(c),
        _set(**{"Scheduling/SlurmSettings/QueueUpdateStrategy": "TERMINATE"})(c))),
    "slurm-settings": (P5, None, _set(**{"Scheduling/SlurmSettings/ScaledownIdletime": 45})),
    "queue-tags": (P5, None, _set(**{"Scheduling/SlurmQueues/cpu/Tags": [{"Key": "team", "Value": "nlp"}]})),
    "aws-style-remove-queue-with-drain": (AWS_STYLE, None, _drop("Scheduling/SlurmQueues", "cpu")),
    "aws-style-max-down-with-drain": (AWS_STYLE, None, _set(**{
        "Scheduling/SlurmQueues/train/ComputeResources/p4d/MaxCount": 1})),
    "aws-style-remove-ebs": (AWS_STYLE, None, _drop("SharedStorage", "shared-ebs")),
}


class StandInCluster:
    """A stand-in for pcluster.models.cluster.Cluster, for the oracle: the states pcluster reads from AWS."""

    name = stack_name = "oracle"

    def __init__(self, fleet, login_nodes="stopped"):
        self.fleet, self.login_nodes = fleet, login_nodes
        self.head_node_instance = type("HeadNode", (), {"state": "running"})()

    def has_running_capacity(self):
        return self.fleet == "running"

    def has_running_login_nodes(self, pool_name=None):
        return self.login_nodes == "running"


def _pair(kind):
    base, old_mutation, new_mutation = KINDS[kind]
    old, new = copy.deepcopy(base), copy.deepcopy(base)
    for mutation, config in ((old_mutation, old), (new_mutation, new)):
        if mutation:
            mutation(config)
    return old, new


def _oracle(old, new, fleet, monkeypatch, login_nodes="stopped"):
    from pcluster.config.config_patch import ConfigPatch

    monkeypatch.setenv("AWS_DEFAULT_REGION", old["Region"])
    allowed, rows = ConfigPatch(StandInCluster(fleet, login_nodes), old, new).check()
    return allowed, [("/".join([*row[0], row[1]]), row[4], row[7]) for row in rows[1:]]


def _ours(tmp_path, old, new, fleet, *options):
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    (tmp_path / "new.yaml").write_text(yaml.safe_dump(new, sort_keys=False))
    res = run_hpc("cluster", "diff", str(tmp_path / "old.yaml"), str(tmp_path / "new.yaml"), "--fleet", fleet,
                  "--json", *options)
    assert res.returncode in (0, 1), res.stderr
    data = cli_json(res)
    assert res.returncode == (0 if data["appliable"] else 1)
    # an added or removed list item is named in our key path ([name]); pcluster names only the list
    return data, [(re.sub(r"\[[^\]]*\]$", "", c["path"]) if c["old"] is None or c["new"] is None else c["path"],
                   c["check"], c["policy"]) for c in data["changes"]]


@pytest.mark.parametrize("fleet", ["running", "stopped"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_verdicts_equal_pclusters_own(tmp_path, monkeypatch, kind, fleet):
    old, new = _pair(kind)
    allowed, rows = _oracle(old, new, fleet, monkeypatch)
    data, ours = _ours(tmp_path, old, new, fleet)
    assert rows, f"{kind}: the pair must differ"
    assert (data["appliable"], ours) == (allowed, rows)
    assert data["declared"]["fleet"] == fleet
    for change in data["changes"]:
        assert change["accepted_now"] == (change["check"] == "SUCCEEDED")
        assert (change["action"] is None) == change["accepted_now"]


# Known answers, so the comparison above cannot pass by both sides saying nothing.
@pytest.mark.parametrize("kind, fleet, check, policy", [
    ("max-count-up", "running", "SUCCEEDED", "RESIZE_UPDATE_STRATEGY_ON_REMOVE"),
    ("max-count-down", "running", "ACTION NEEDED", "RESIZE_UPDATE_STRATEGY_ON_REMOVE"),
    ("max-count-down", "stopped", "SUCCEEDED", "RESIZE_UPDATE_STRATEGY_ON_REMOVE"),
    ("instance-type", "running", "ACTION NEEDED", "COMPUTE_FLEET_STOP"),
    ("instance-type-with-drain", "running", "ACTION NEEDED", "COMPUTE_FLEET_STOP"),  # DRAIN does not unlock it
    ("capacity-reservation", "running", "ACTION NEEDED", "QUEUE_UPDATE_STRATEGY"),
    ("capacity-reservation-with-drain", "running", "SUCCEEDED", "QUEUE_UPDATE_STRATEGY"),
    ("remove-queue-with-terminate", "running", "SUCCEEDED", "RESIZE_UPDATE_STRATEGY_ON_REMOVE"),
    ("shared-storage-add-external-efs", "running", "SUCCEEDED", "SHARED_STORAGE_UPDATE_POLICY"),
    ("shared-storage-add-managed-ebs", "running", "ACTION NEEDED", "SHARED_STORAGE_UPDATE_POLICY"),
    ("head-node-type", "stopped", "FAILED", "UNSUPPORTED"),
    ("remove-queue", "running", "ACTION NEEDED", "RESIZE_UPDATE_STRATEGY_ON_REMOVE"),
    ("add-queue", "running", "SUCCEEDED", "RESIZE_UPDATE_STRATEGY_ON_REMOVE"),
])
def test_known_answers(tmp_path, kind, fleet, check, policy):
    old, new = _pair(kind)
    data, ours = _ours(tmp_path, old, new, fleet)
    assert [(c[1], c[2]) for c in ours if c[2] != "SUPPORTED"] == [(check, policy)]


def test_text_output_names_the_action(tmp_path):
    old, new = _pair("remove-queue")
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    (tmp_path / "new.yaml").write_text(yaml.safe_dump(new))
    res = run_hpc("cluster", "diff", str(tmp_path / "old.yaml"), str(tmp_path / "new.yaml"))
    assert res.returncode == 1
    assert "Scheduling/SlurmQueues[cpu]" in res.stdout and "RESIZE_UPDATE_STRATEGY_ON_REMOVE" in res.stdout
    assert "action: Stop the compute fleet or set QueueUpdateStrategy:TERMINATE" in res.stdout
    assert "would refuse this update" in res.stdout


def test_no_changes_is_exit_0(tmp_path):
    path = REPO / "cluster-configs" / "p5-reservation.yaml"
    res = run_hpc("cluster", "diff", str(path), str(path), "--json")
    assert res.returncode == 0 and cli_json(res)["changes"] == []


def test_the_edit_commands_and_diff_together(tmp_path):
    """An admin's round: edit a copy with `queue set`, then ask what update-cluster would say."""
    old = REPO / "cluster-configs" / "p5-reservation.yaml"
    new = tmp_path / "new.yaml"
    new.write_bytes(old.read_bytes())
    assert run_hpc("cluster", "queue", "set", str(new), "cpu", "--max", "1").returncode == 0
    running = run_hpc("cluster", "diff", str(old), str(new), "--fleet", "running", "--json")
    stopped = run_hpc("cluster", "diff", str(old), str(new), "--fleet", "stopped", "--json")
    assert (running.returncode, stopped.returncode) == (1, 0)
    change, = cli_json(running)["changes"]
    assert (change["path"], change["old"], change["new"]) == ("Scheduling/SlurmQueues[cpu]/ComputeResources"
                                                              "[m5-8xlarge]/MaxCount", 2, 1)


@pytest.mark.parametrize("args, words", [
    (["--fleet", "paused"], "--fleet 'paused' is not one of running, stopped"),
])
def test_bad_usage(args, words):
    path = str(REPO / "cluster-configs" / "p5-reservation.yaml")
    res = run_hpc("cluster", "diff", path, path, *args)
    assert res.returncode == 2 and words in res.stderr


def test_bad_files_are_one_clear_error(tmp_path):
    good = REPO / "cluster-configs" / "p5-reservation.yaml"
    template = tmp_path / "template.yaml"
    template.write_text(good.read_text().replace("us-west-2", "${AWS_REGION}"))
    res = run_hpc("cluster", "diff", str(good), str(template))
    assert res.returncode == 1 and "Region holds the variable ${AWS_REGION}" in res.stderr
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text(good.read_text().replace("MaxCount: 4", "MaxCount: many"))
    res = run_hpc("cluster", "diff", str(good), str(invalid))
    assert res.returncode == 1 and "not a valid ParallelCluster v3 config" in res.stderr and "MaxCount" in res.stderr
    assert "Traceback" not in res.stderr


LOGIN = {"Pools": [{"Name": "login", "Count": 1, "InstanceType": "m5.xlarge",
                    "Networking": {"SubnetIds": ["subnet-0fedcba9876543210"]}}]}


@pytest.mark.parametrize("login_nodes", ["running", "stopped"])
def test_login_nodes_as_declared(tmp_path, monkeypatch, login_nodes):
    """A login pool's instance type: pcluster asks whether that pool runs; the default is 'running' when OLD has
    a pool with nodes."""
    old = copy.deepcopy(P5) | {"LoginNodes": copy.deepcopy(LOGIN)}
    new = copy.deepcopy(old)
    new["LoginNodes"]["Pools"][0]["InstanceType"] = "m5.8xlarge"
    allowed, rows = _oracle(old, new, "stopped", monkeypatch, login_nodes)
    options = [] if login_nodes == "running" else ["--login-nodes", "stopped"]
    data, ours = _ours(tmp_path, old, new, "stopped", *options)
    assert (data["appliable"], ours) == (allowed, rows)
    assert data["declared"]["login_nodes"] == login_nodes
    assert allowed is (login_nodes == "stopped")


def test_an_old_config_from_an_older_parallelcluster_is_still_compared(tmp_path, monkeypatch):
    """The running cluster's config may predate 3.16 (alinux2 was dropped): pcluster compares it all the same,
    and so do we, with a note; the NEW config must pass the schema (update-cluster checks it first)."""
    old = copy.deepcopy(P5)
    old["Image"]["Os"] = "alinux2"
    new = copy.deepcopy(P5)
    _set(**{f"{CR_P5}/MaxCount": 8})(new)
    allowed, rows = _oracle(old, new, "running", monkeypatch)
    data, ours = _ours(tmp_path, old, new, "running")
    assert (data["appliable"], ours) == (allowed, rows)
    assert any("fails pcluster 3.16's schema: Image/Os" in note for note in data["notes"])


NO_NETWORK = '''
import os, socket

def _refuse(*args, **kwargs):  # any name look-up or connection is recorded, then refused
    with open(os.environ["HPC_TEST_NETWORK_LOG"], "a") as log:
        log.write(repr(args[:2]) + "\\n")
    raise OSError("network use in an offline command")

socket.getaddrinfo = socket.gethostbyname = socket.create_connection = _refuse
socket.socket.connect = socket.socket.connect_ex = _refuse
'''


def test_edits_and_diff_never_touch_the_network(tmp_path):
    """A stand-in for a machine without a network: every DNS look-up and connection from the CLI's process
    (sitecustomize) is logged and refused. Editing and comparing must not try once."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(NO_NETWORK)
    log = tmp_path / "network.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(PYTHONPATH=str(tmp_path / "site"), HPC_TEST_NETWORK_LOG=str(log))
    new = tmp_path / "new.yaml"
    new.write_bytes((REPO / "cluster-configs" / "p5-reservation.yaml").read_bytes())
    commands = [["cluster", "queue", "add", str(new), "--queue-spec", "extra=p4d.24xlarge:2"],
                ["cluster", "queue", "set", str(new), "p5", "--max", "2"],
                ["cluster", "queue", "remove", str(new), "cpu"],
                ["cluster", "diff", str(REPO / "cluster-configs" / "p5-reservation.yaml"), str(new)]]
    # One process runs the four commands in turn (hpc's main, as the console script calls it), then looks a name
    # up itself: the trap works, and that look-up must be all it logged.
    driver = ("import json, socket, sys\nfrom toolkit.cli.main import main\ncodes = []\n"
              "for argv in json.loads(sys.argv[1]):\n    try:\n        main(argv)\n    except SystemExit as exc:\n"
              "        codes.append(exc.code)\nprint(json.dumps(codes))\ntry:\n"
              "    socket.getaddrinfo('example.org', 443)\nexcept OSError:\n    pass\n")
    env["PYTHONPATH"] += os.pathsep + str(REPO)
    res = subprocess.run([sys.executable, "-c", driver, json.dumps(commands)], env=env, capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert json.loads(res.stdout.splitlines()[-1]) == [0, 0, 0, 1], res.stderr
    assert [line for line in log.read_text().splitlines() if "example.org" not in line] == []
    assert "example.org" in log.read_text()
