"""Issue 35, topology-aware placement: Slurm's topology file for a queue from EC2's instance topology
(toolkit.cluster.topology, `hpc cluster topology`), checked by Slurm's own parser: a throwaway slurmctld of this
machine's Slurm 22.05 (topology/tree) and, where the 24.11 lane's root file system is here, of 24.11
(topology/block), each in a temp dir on a free port, answering `scontrol show topology`.

The fixture tests/data/ec2-instance-topology-16.json is a describe-instance-topology response in AWS's documented
format (Amazon EC2 User Guide, "How Amazon EC2 topology works"; EC2 API Reference, DescribeInstanceTopology:
Instances[].InstanceId, InstanceType, GroupName, NetworkNodes top layer first, AvailabilityZone, ZoneId,
CapacityBlockId): 16 p5.48xlarge under one layer-1 node, 2 layer-2 and 4 layer-3 nodes (4 instances each), node
numbers dealt round-robin over the leaves so that name order is not network order.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, free_port, run_hpc
from toolkit.cluster import topology as t
from toolkit.errors import UsageError

DATA = REPO / "tests" / "data"
EC2_JSON = DATA / "ec2-instance-topology-16.json"
NODES_MAP = DATA / "ec2-instance-topology-16.nodes"
WIDE_MAP = DATA / "ec2-instance-topology-16.wide.nodes"


def _fixture() -> t.QueueTopology:
    return t.read_queue_topology(EC2_JSON, NODES_MAP, "gpu")


def _leaf_of() -> dict[str, str]:
    """node -> its layer-3 network node, straight from the JSON and the map (not through the module)."""
    ids = dict(line.split() for line in NODES_MAP.read_text().splitlines() if line.startswith("i-"))
    return {ids[i["InstanceId"]]: i["NetworkNodes"][-1] for i in json.loads(EC2_JSON.read_text())["Instances"]}


def test_the_order_keeps_the_nodes_of_each_network_node_together_and_differs_from_name_order():
    order = _fixture().order
    leaf = _leaf_of()
    assert sorted(order) == sorted(leaf) and len(order) == 16
    runs = [leaf[n] for i, n in enumerate(order) if i == 0 or leaf[order[i - 1]] != leaf[n]]
    assert len(runs) == 4 == len(set(runs))  # each leaf's 4 nodes in one run
    ids = dict(line.split() for line in NODES_MAP.read_text().splitlines() if line.startswith("i-"))
    layer2 = {ids[i["InstanceId"]]: i["NetworkNodes"][1] for i in json.loads(EC2_JSON.read_text())["Instances"]}
    assert len([n for i, n in enumerate(order) if i == 0 or layer2[order[i - 1]] != layer2[n]]) == 2
    assert order != sorted(order, key=lambda n: int(n.rsplit("-", 1)[1]))


def test_the_tree_names_every_node_once_under_its_leaf_and_reads_back_in_the_same_order():
    text = t.tree_text(_fixture())
    leaf = _leaf_of()
    nodes_lines = [line for line in text.splitlines() if " Nodes=" in line]
    seen = []
    for line in nodes_lines:
        switch = line.split()[0].removeprefix("SwitchName=")
        names = t.expand_hostlist(line.split("Nodes=")[1])
        assert {leaf[n] for n in names} == {switch}
        seen += names
    assert sorted(seen) == sorted(leaf)
    assert t.order_from_conf(text) == _fixture().order
    assert len([line for line in text.splitlines() if "Switches=" in line]) == 3  # 2 layer-2, 1 layer-1


def test_several_top_layer_nodes_get_one_root_so_that_a_job_may_span_them():
    instances = [{"InstanceId": f"i-{n}", "NetworkNodes": [f"nn-top{n % 2}", f"nn-mid{n % 2}", f"nn-leaf{n % 2}"]}
                 for n in range(4)]
    topo = t.queue_topology(instances, {f"i-{n}": f"q-st-cr-{n + 1}" for n in range(4)}, "q")
    text = t.tree_text(topo)
    assert f"SwitchName={t.ROOT_SWITCH} Switches=nn-top0,nn-top1" in text
    assert t.order_from_conf(text) == ["q-st-cr-1", "q-st-cr-3", "q-st-cr-2", "q-st-cr-4"]


def test_the_block_form_has_one_block_per_lowest_network_node_in_network_order():
    text = t.block_text(_fixture())
    blocks = [line for line in text.splitlines() if line.startswith("BlockName=")]
    assert len(blocks) == 4 and all(len(t.expand_hostlist(b.split("Nodes=")[1])) == 4 for b in blocks)
    assert t.order_from_conf(text) == _fixture().order
    assert "BlockSizes" not in text and "Switch" not in text


def test_other_queues_nodes_are_left_out_and_named():
    lines = NODES_MAP.read_text().replace("gpu-st-p5-16", "cpu-st-c5-1")
    topo = t.queue_topology(t.parse_instances(EC2_JSON.read_text()), t.parse_nodes_map(lines), "gpu")
    assert len(topo.placements) == 15 and topo.left_out and "cpu-st-c5-1" in topo.left_out[0]


@pytest.mark.parametrize("ec2,nodes,message", [
    ('{"Reservations": []}', None, "no `Instances` list"),
    ('{"Instances": [{"InstanceId": "i-1", "NetworkNodes": []}]}', None, "no NetworkNodes"),
    (None, "i-0 a\n", "has no node name in the nodes map"),
    (None, "i-1 a\ni-1 b\n", "instance i-1 has two node names: a and b"),
    (None, "i-1 a\ni-2 a\n", "node a is named for two instances"),
    (None, "i-1 a b\n", "expected `instance-id node-name`"),
])
def test_bad_input_is_one_usage_error(ec2, nodes, message):
    instances = '{"Instances": [{"InstanceId": "i-1", "NetworkNodes": ["a", "b", "c"]}]}'
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace("[", r"\[")):
        t.queue_topology(t.parse_instances(ec2 or instances), t.parse_nodes_map(nodes or "i-1 w1\n"), "q")


def test_hostlists_compress_and_expand_as_slurm_writes_them():
    assert t.hostlist(["w1", "w2", "w3", "w7", "c1"]) == "w[1-3,7],c1"
    assert t.expand_hostlist("w[1-3,7],c1,gpu-st-p5-[10,12]") == ["w1", "w2", "w3", "w7", "c1", "gpu-st-p5-10",
                                                                   "gpu-st-p5-12"]
    assert t.expand_hostlist("n[08-10]") == ["n08", "n09", "n10"]


def test_block_is_refused_where_slurm_is_older_than_23_11():
    with pytest.raises(UsageError, match="22.05 has no topology/block"):
        t.check_form("block", (22, 5))
    assert t.check_form("block", (24, 11)) == "block" and t.check_form("block", None) == "block"


def test_the_command_writes_the_file_and_refuses_bad_input_with_exit_2(tmp_path):
    out = tmp_path / "topology.conf"
    res = run_hpc("cluster", "topology", str(EC2_JSON), "--queue", "gpu", "--nodes-map", str(NODES_MAP),
                  "-o", str(out), "--json", env={k: v for k, v in os.environ.items() if k != "SLURM_CONF"})
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(res.stdout)["data"]
    assert data["order"] == _fixture().order and out.read_text() == data["text"] == t.tree_text(
        _fixture(), EC2_JSON.name)
    bad = run_hpc("cluster", "topology", str(NODES_MAP), "--queue", "gpu", "--nodes-map", str(NODES_MAP))
    assert bad.returncode == 2 and "not JSON" in bad.stderr and "Traceback" not in bad.stdout + bad.stderr


# --- Slurm's own parser ----------------------------------------------------------------------------------------

SLURM_CONF = """\
ClusterName=topocheck
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={port}
SlurmUser={user}
# no munge: a throwaway controller that only parses and answers scontrol here
AuthType=auth/none
CredType=cred/none
StateSaveLocation={dir}/state
SlurmctldPidFile={dir}/slurmctld.pid
SlurmctldLogFile={dir}/slurmctld.log
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
TopologyPlugin=topology/{form}
ProctrackType=proctrack/linuxproc
MpiDefault=none
MailProg=/bin/true
NodeName={nodes} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN
PartitionName=gpu Nodes={nodes} Default=YES State=UP
"""


def _start_controller(conf_dir: Path, form: str, prefix: list[str], conf_path: str) -> tuple[subprocess.Popen, str]:
    import getpass

    (conf_dir / "state").mkdir()
    inner = conf_path.rsplit("/", 1)[0]
    (conf_dir / "slurm.conf").write_text(SLURM_CONF.format(port=free_port(), user=getpass.getuser(), dir=inner,
                                                           form=form, nodes=t.hostlist(_fixture().order)))
    (conf_dir / "topology.conf").write_text(t.topology_text(_fixture(), form))  # type: ignore[arg-type]
    env = {**os.environ, "SLURM_CONF": conf_path}
    ctld = subprocess.Popen([*prefix, "slurmctld", "-D", "-i", "-f", conf_path], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        shown = subprocess.run([*prefix, "scontrol", "show", "topology"], env=env, capture_output=True, text=True)
        if shown.returncode == 0 and shown.stdout.strip():
            return ctld, shown.stdout
        if ctld.poll() is not None:
            break
        time.sleep(0.3)
    ctld.kill()
    log = (conf_dir / "slurmctld.log")
    pytest.fail(f"slurmctld did not answer: {log.read_text()[-2000:] if log.exists() else 'no log'}")


def _stop(ctld: subprocess.Popen) -> None:
    ctld.terminate()
    try:
        ctld.wait(timeout=15)
    except subprocess.TimeoutExpired:
        ctld.kill()
        ctld.wait()


def _log_errors(conf_dir: Path) -> list[str]:
    """The controller's errors other than the missing state files of a first start (-i) and 22.05's loading of
    every MPI plugin (this machine's pmix_v4 finds no PMIx library: nothing to do with topology)."""
    lines = (conf_dir / "slurmctld.log").read_text().splitlines()
    return [line for line in lines if ("error" in line or "fatal" in line)
            and not any(word in line for word in ("state", "pmix", "MPI:"))]


def _switch_lines(shown: str, key: str) -> dict[str, str]:
    return {line.split()[0].split("=", 1)[1]: line for line in shown.splitlines() if line.startswith(key)}


@pytest.mark.skipif(not shutil.which("slurmctld") or not shutil.which("scontrol"), reason="no Slurm here")
def test_slurm_22_05_reads_the_tree_and_shows_our_switches(tmp_path):
    ctld, shown = _start_controller(tmp_path, "tree", [], str(tmp_path / "slurm.conf"))
    try:
        errors = _log_errors(tmp_path)
    finally:
        _stop(ctld)
    assert errors == []
    switches = _switch_lines(shown, "SwitchName=")
    ours = [line.split()[0].removeprefix("SwitchName=") for line in t.tree_text(_fixture()).splitlines()
            if line.startswith("SwitchName=")]
    assert sorted(switches) == sorted(ours)
    leaf = _leaf_of()
    for name, line in switches.items():
        nodes = t.expand_hostlist(line.split("Nodes=")[1].split()[0])
        if "Switches=" not in line:  # a leaf: Slurm's Level=0 with exactly its network node's instances
            assert "Level=0" in line and {leaf[n] for n in nodes} == {name} and len(nodes) == 4
        else:  # the top: Slurm counts every node under it
            assert len(nodes) in (8, 16)
    assert sum("Level=2" in line for line in switches.values()) == 1


TRIXIE = Path("/var/tmp/hpc-rootfs-trixie")  # the 24.11 lane's root file system (testbench.layout.LANES)


@pytest.mark.skipif(not (TRIXIE / "usr/sbin/slurmctld").exists() or os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="the 24.11 lane's root file system is not built here (or not root)")
def test_slurm_24_11_reads_the_block_form(tmp_path):
    # 24.11's own binaries in their root file system, the temp dir bound at its /mnt in a private mount namespace:
    # nothing of the lane (its daemons, its state dir) is used or changed.
    prefix = ["unshare", "-m", "--propagation", "private", "sh", "-c",
              f'mount --bind "$0" {TRIXIE}/mnt && mount -t proc proc {TRIXIE}/proc && exec chroot {TRIXIE} "$@"',
              str(tmp_path)]
    ctld, shown = _start_controller(tmp_path, "block", prefix, "/mnt/slurm.conf")
    try:
        errors = _log_errors(tmp_path)
    finally:
        _stop(ctld)
    assert errors == []
    blocks = _switch_lines(shown, "BlockName=")
    leaf = _leaf_of()
    assert len(blocks) == 4
    for name, line in blocks.items():
        nodes = t.expand_hostlist(line.split("Nodes=")[1].split()[0])
        assert {leaf[n] for n in nodes} == {name} and "BlockSize=4" in line


def test_a_job_on_a_queue_with_a_topology_file_starts_its_ranks_by_the_hostfile(tmp_path):
    import yaml

    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_CONF", "HPC_CLUSTER_CONFIG")}
    made = run_hpc("cluster", "config", "--name", "t", "--region", "us-east-2", "--subnet", "subnet-0123456789abcdef0",
                   "--key-name", "me", "--queue-spec", "gpu=p5.48xlarge:16", "-o", str(tmp_path / "cluster.yaml"),
                   env=env)
    assert made.returncode == 0, made.stderr
    assert run_hpc("cluster", "topology", str(EC2_JSON), "--queue", "gpu", "--nodes-map", str(NODES_MAP), "-o",
                   str(tmp_path / "gpu.topology"), env=env).returncode == 0
    config = yaml.safe_load((tmp_path / "cluster.yaml").read_text())
    queue = config["Scheduling"]["SlurmQueues"][0]
    queue.setdefault("Tags", []).append({"Key": "hpc:topology", "Value": "gpu.topology"})
    (tmp_path / "tagged.yaml").write_text(yaml.safe_dump(config))
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")

    def plan(cluster: str, *extra: str) -> dict:
        res = run_hpc("run", str(script), "--nodes", "4", "--queue", "gpu", "--cluster", str(tmp_path / cluster),
                      "--dry-run", "--json", *extra, env=env, cwd=tmp_path)
        assert res.returncode == 0, res.stdout + res.stderr
        return json.loads(res.stdout)["data"]

    ordered = plan("tagged.yaml", "--executor", "sbatch")
    text = ordered["script"]
    [srun] = [line for line in text.splitlines() if line.startswith(("srun ", "SLURM_HOSTFILE=")) and "bash -c" in line]
    assert srun.startswith('SLURM_HOSTFILE="$HPC_HOSTFILE" srun --distribution=arbitrary --ntasks=32 ')
    assert "--ntasks-per-node" not in srun
    assert f"HPC_NETWORK_ORDER=({' '.join(_fixture().order)})" in text
    assert "for ((task = 0; task < 8; task++))" in text  # one line per rank: 8 GPUs per p5 node
    # the hostfile's loop and MASTER_ADDR come before the ranks start
    assert text.index('read -r MASTER_ADDR < "$HPC_HOSTFILE"') < text.index(srun)
    assert ordered["summary"]["rank_order"] == f"ranks ordered by network node from {tmp_path / 'gpu.topology'}"

    plain = plan("cluster.yaml", "--executor", "sbatch")
    assert "HPC_HOSTFILE" not in plain["script"] and plain["summary"]["rank_order"] is None
    submitit = plan("tagged.yaml", "--executor", "slurm")
    assert submitit["summary"]["rank_order"].startswith("Slurm's (submitit's srun)")
    # without --executor, a job goes as its rendered script, which orders its ranks on the tagged queue
    chosen = plan("tagged.yaml")
    assert chosen["executor"] == "sbatch" and "HPC_HOSTFILE" in chosen["script"]
    assert plan("cluster.yaml")["executor"] == "sbatch" and "HPC_HOSTFILE" not in plan("cluster.yaml")["script"]


# --- ParallelCluster's own rules for the plugin setting ----------------------------------------------------------


def test_parallelclusters_validators_let_topology_plugin_through_custom_slurm_settings(tmp_path):
    """The setting the admin adds beside the file, as `hpc cluster validate` judges it with aws-parallelcluster's
    own schema and validators (CustomSlurmSettingsValidator and its deny-list, pcluster/validators/
    slurm_settings_validator.py SLURM_SETTINGS_DENY_LIST): TopologyPlugin passes at SlurmConf level where
    TaskPlugin, on the deny-list, is refused; and `hpc cluster diff` (pcluster's update policies) says a running
    cluster takes it with `pcluster update-cluster`."""
    import yaml

    base = yaml.safe_load((REPO / "cluster-configs" / "p3dn-efa-fsx.yaml").read_text())

    def with_setting(name: str, value: str) -> Path:
        config = json.loads(json.dumps(base))
        config["Scheduling"].setdefault("SlurmSettings", {})["CustomSlurmSettings"] = [{name: value}]
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    topology = with_setting("TopologyPlugin", "topology/tree")
    ok = run_hpc("cluster", "validate", str(topology), "--json")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert not [f for f in json.loads(ok.stdout)["data"]["findings"] if "CustomSlurmSettings" in json.dumps(f)]
    refused = run_hpc("cluster", "validate", str(with_setting("TaskPlugin", "task/none")))
    assert refused.returncode == 1 and "settings at SlurmConf level is not allowed: TaskPlugin" in refused.stdout
    diff = run_hpc("cluster", "diff", str(REPO / "cluster-configs" / "p3dn-efa-fsx.yaml"), str(topology))
    assert diff.returncode == 0, diff.stdout + diff.stderr
    assert "Scheduling/SlurmSettings/CustomSlurmSettings" in diff.stdout and "SUPPORTED" in diff.stdout
