"""A queue's network topology for Slurm, from EC2's instance topology: the topology.conf file (tree or block form)
and the order of its nodes by network node, which jobs use to place neighbouring ranks on neighbouring nodes.

EC2's input is the JSON `aws ec2 describe-instance-topology` prints (Amazon EC2 User Guide, "Amazon EC2 instance
topology" / "How Amazon EC2 topology works"; EC2 API Reference, DescribeInstanceTopology): `Instances`, each with
InstanceId, InstanceType, NetworkNodes (the network nodes from the top layer down to the one the instance connects
to: 3 on p4d/p5, 4 on some newer types, fewer for some Capacity Reservations), AvailabilityZone, ZoneId and
optionally GroupName and CapacityBlockId. EC2 knows instances, Slurm knows node names: a nodes map joins them
(`instance-id node-name` per line; comma-separated works too).

Slurm's forms (topology.conf(5)): topology/tree, one line per switch, `SwitchName=S Nodes=...` for a switch that
nodes connect to and `SwitchName=S Switches=...` above it; topology/block (Slurm >= 23.11), `BlockName=B
Nodes=...` per block of nodes that share their lowest network node. Switches and blocks are named by EC2's own
network node ids, so a line of the file traces back to the JSON.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any, Iterable, Literal

from toolkit.errors import UsageError
from toolkit.textfile import read_text

Form = Literal["tree", "block"]
FORMS = ("tree", "block")
BLOCK_MIN_SLURM = (23, 11)  # topology/block arrived in Slurm 23.11 (topology.conf(5), SchedMD/slurm NEWS)
ROOT_SWITCH = "ec2-top"  # joins several top-layer network nodes: Slurm's tree jobs span only a connected fabric
# ParallelCluster's Slurm node names: <queue>-<st|dy>-<compute resource>-<n> (aws-parallelcluster-node,
# src/slurm_plugin/slurm_resources.py, parse_nodename)
NODE_NAME = re.compile(r"^(?P<queue>[a-z0-9-]+?)-(?:st|dy)-(?P<cr>[A-Za-z0-9-]+)-(?P<n>\d+)$")


@dataclasses.dataclass(frozen=True)
class Placement:
    """One Slurm node and its network path, top layer first (EC2's NetworkNodes)."""
    node: str
    instance_id: str
    network_nodes: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class QueueTopology:
    queue: str
    placements: tuple[Placement, ...]  # in network order (network_order)
    left_out: tuple[str, ...] = ()  # instances of the JSON whose nodes belong to other queues

    @property
    def order(self) -> list[str]:
        return [p.node for p in self.placements]

    def as_dict(self) -> dict[str, Any]:
        return {"queue": self.queue, "nodes": [dataclasses.asdict(p) for p in self.placements],
                "order": self.order, "left_out": list(self.left_out)}


def _bad(source: str, what: str, fix: str) -> UsageError:
    return UsageError(f"{source}: {what}", fix=fix)


SAVE_FIX = ("save it with `aws ec2 describe-instance-topology --region R --instance-ids ... > FILE` (or "
            "--group-names PLACEMENT_GROUP) and pass that file unchanged")


def parse_instances(text: str, source: str = "<ec2 json>") -> list[dict[str, Any]]:
    """The instances of a describe-instance-topology response, checked against AWS's documented format."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _bad(source, f"not JSON ({exc.msg}, line {exc.lineno})", SAVE_FIX) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("Instances"), list):
        raise _bad(source, "not EC2's instance topology: no `Instances` list at the top", SAVE_FIX)
    instances = doc["Instances"]
    for index, item in enumerate(instances):
        where = f"Instances[{index}]"
        if not isinstance(item, dict) or not isinstance(item.get("InstanceId"), str) or not item["InstanceId"]:
            raise _bad(source, f"{where} has no InstanceId", SAVE_FIX)
        nodes = item.get("NetworkNodes")
        if not isinstance(nodes, list) or not nodes or not all(isinstance(n, str) and n for n in nodes):
            raise _bad(source, f"{where} ({item['InstanceId']}) has no NetworkNodes list of network node ids",
                       SAVE_FIX + "; instance types without topology support have none")
    ids = [item["InstanceId"] for item in instances]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise _bad(source, f"instance {twice[0]} is listed twice", "save one response (the CLI joins its pages)")
    if not instances:
        raise _bad(source, "no instances", SAVE_FIX)
    return instances


def parse_nodes_map(text: str, source: str = "<nodes map>") -> dict[str, str]:
    """`instance-id node-name` lines (space- or comma-separated; `#` comments, blank lines) -> {id: node}."""
    mapping: dict[str, str] = {}
    owner: dict[str, str] = {}
    fix = "write one `instance-id node-name` line per node (docs/admins.md, Topology-aware placement)"
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].replace(",", " ").strip()
        if not line:
            continue
        words = line.split()
        if len(words) != 2 or not words[0].startswith("i-"):
            raise _bad(f"{source}:{number}", f"expected `instance-id node-name`, got {raw.strip()!r}", fix)
        instance_id, node = words
        if mapping.get(instance_id, node) != node:
            raise _bad(f"{source}:{number}", f"instance {instance_id} has two node names: {mapping[instance_id]} "
                       f"and {node}", "keep the one Slurm uses now (`scontrol show node NAME`: NodeAddr)")
        if owner.get(node, instance_id) != instance_id:
            raise _bad(f"{source}:{number}", f"node {node} is named for two instances: {owner[node]} and "
                       f"{instance_id}", "keep the instance that node runs on now")
        mapping[instance_id], owner[node] = node, instance_id
    if not mapping:
        raise _bad(source, "no `instance-id node-name` lines", fix)
    return mapping


def network_order(placements: Iterable[Placement]) -> list[Placement]:
    """Nodes sharing a network node adjacent at every layer: sorted by network path (top layer first), so the
    nodes under one lowest network node come together, those groups under one layer-2 node next to each other,
    and so on; the node name's number breaks ties (ParallelCluster's <queue>-st-<cr>-<n>)."""
    def key(p: Placement) -> tuple:
        return (*p.network_nodes, *_name_key(p.node))
    return sorted(placements, key=key)


def _name_key(name: str) -> tuple[str, int]:
    match = re.match(r"^(.*?)(\d+)$", name)
    return (match.group(1), int(match.group(2))) if match else (name, -1)


def queue_topology(instances: list[dict[str, Any]], nodes_map: dict[str, str], queue: str,
                   source: str = "<ec2 json>") -> QueueTopology:
    """The queue's nodes with their network paths: every instance of the JSON must have a node name; those of
    other queues (ParallelCluster's names start with the queue's) are left out and named."""
    missing = [i["InstanceId"] for i in instances if i["InstanceId"] not in nodes_map]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise UsageError(f"{source}: instance {missing[0]}{more} has no node name in the nodes map",
                         fix="add its `instance-id node-name` line to the map, or save the topology of the queue's "
                             "instances only (describe-instance-topology --instance-ids / --group-names)")
    placements, left_out = [], []
    for item in instances:
        node = nodes_map[item["InstanceId"]]
        parsed = NODE_NAME.match(node)
        if parsed and parsed.group("queue") != queue:
            left_out.append(f"{item['InstanceId']} ({node})")
            continue
        placements.append(Placement(node, item["InstanceId"], tuple(item["NetworkNodes"])))
    if not placements:
        raise UsageError(f"no instance of {source} is a node of queue {queue}",
                         fix=f"check --queue (ParallelCluster names its nodes {queue}-st-CR-N / {queue}-dy-CR-N)")
    depths = {len(p.network_nodes) for p in placements}
    if len(depths) > 1:  # a tree needs one depth; instances of one type and reservation kind share it
        raise UsageError(f"{source}: the queue's instances have network paths of different depths "
                         f"({', '.join(map(str, sorted(depths)))} layers)",
                         fix="write one topology file per instance type (one queue, one compute resource)")
    return QueueTopology(queue, tuple(network_order(placements)), tuple(left_out))


def read_queue_topology(ec2_json: str | Path, nodes_map: str | Path, queue: str) -> QueueTopology:
    instances = parse_instances(read_text(Path(ec2_json), "EC2 instance topology", fix=SAVE_FIX), str(ec2_json))
    mapping = parse_nodes_map(read_text(Path(nodes_map), "nodes map", fix="pass the map with --nodes-map FILE"),
                              str(nodes_map))
    return queue_topology(instances, mapping, queue, str(ec2_json))


def hostlist(names: Iterable[str]) -> str:
    """Slurm's hostlist expression for `names` (w1,w2,w3,w7 -> w[1-3,7]); Slurm expands it again."""
    groups: dict[str, list[tuple[int, str]]] = {}
    plain: list[str] = []
    for name in names:
        match = re.match(r"^(.*?)(\d+)$", name)
        if match and not match.group(2).startswith("0"):  # zero-padded numbers stay as written
            groups.setdefault(match.group(1), []).append((int(match.group(2)), name))
        else:
            plain.append(name)
    parts = list(plain)
    for prefix, numbered in groups.items():
        numbers = sorted({n for n, _ in numbered})
        if len(numbers) == 1:
            parts.append(f"{prefix}{numbers[0]}")
            continue
        runs: list[list[int]] = []
        for n in numbers:
            if runs and n == runs[-1][-1] + 1:
                runs[-1].append(n)
            else:
                runs.append([n])
        spans = [f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs]
        parts.append(f"{prefix}[{','.join(spans)}]")
    return ",".join(parts)


def expand_hostlist(expression: str) -> list[str]:
    """Slurm's hostlist expression -> names (w[1-3,7],c1 -> w1 w2 w3 w7 c1): what topology.conf's Nodes= hold."""
    names: list[str] = []
    for match in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?([^,\[]*)", expression):
        prefix, ranges, suffix = match.group(1), match.group(2), match.group(3)
        if ranges is None:
            names.append(prefix + suffix)
            continue
        for span in ranges.split(","):
            low, _, high = span.partition("-")
            width = len(low) if low.startswith("0") else 0
            names += [f"{prefix}{n:0{width}d}{suffix}" for n in range(int(low), int(high or low) + 1)]
    return names


def _header(topo: QueueTopology, form: Form, source: str) -> list[str]:
    lines = [f"# Slurm topology ({'topology/' + form}) of queue {topo.queue}: {len(topo.placements)} nodes, from "
             f"EC2's instance topology ({source}).",
             "# Written by `hpc cluster topology`; names are EC2's network node ids. Write it again when nodes are "
             "replaced."]
    lines += [f"# left out (other queues): {', '.join(topo.left_out)}"] if topo.left_out else []
    return lines


def tree_text(topo: QueueTopology, source: str = "EC2 JSON") -> str:
    """topology.conf for topology/tree: a switch per network node, the lowest ones with their nodes, each upper
    one with the switches below it (children in network order); several top-layer nodes get one root above."""
    lines = _header(topo, "tree", source)
    depth = len(topo.placements[0].network_nodes)
    children: dict[str, list[str]] = {}
    leaves: dict[str, list[str]] = {}
    for p in topo.placements:
        path = p.network_nodes
        leaves.setdefault(path[-1], []).append(p.node)
        for upper, lower in zip(path, path[1:], strict=False):
            kids = children.setdefault(upper, [])
            if lower not in kids:
                kids.append(lower)
    lines += [f"SwitchName={leaf} Nodes={hostlist(nodes)}" for leaf, nodes in leaves.items()]
    for layer in range(depth - 2, -1, -1):  # bottom-up: upper switches after the ones they name
        upper_nodes = dict.fromkeys(p.network_nodes[layer] for p in topo.placements)
        lines += [f"SwitchName={upper} Switches={','.join(children[upper])}" for upper in upper_nodes]
    tops = list(dict.fromkeys(p.network_nodes[0] for p in topo.placements))
    if len(tops) > 1:
        lines.append(f"# {len(tops)} top-layer network nodes: one root above them, so that a job may span them")
        lines.append(f"SwitchName={ROOT_SWITCH} Switches={','.join(tops)}")
    return "\n".join(lines) + "\n"


def block_text(topo: QueueTopology, source: str = "EC2 JSON") -> str:
    """topology.conf for topology/block (Slurm >= 23.11): one block per lowest network node, blocks in network
    order (Slurm's aggregated blocks join neighbouring ones, so the order is the layers above)."""
    lines = _header(topo, "block", source)
    blocks: dict[str, list[str]] = {}
    for p in topo.placements:
        blocks.setdefault(p.network_nodes[-1], []).append(p.node)
    lines += [f"BlockName={block} Nodes={hostlist(nodes)}" for block, nodes in blocks.items()]
    sizes = {len(nodes) for nodes in blocks.values()}
    if len(sizes) > 1:  # Slurm plans on the smallest block size; nodes beyond it in bigger blocks go unplanned
        lines.insert(len(lines) - len(blocks), f"# blocks of {', '.join(map(str, sorted(sizes)))} nodes: Slurm's "
                     "base block size is the smallest (BlockSizes in topology.conf(5))")
    return "\n".join(lines) + "\n"


def topology_text(topo: QueueTopology, form: Form, source: str = "EC2 JSON") -> str:
    return tree_text(topo, source) if form == "tree" else block_text(topo, source)


def check_form(form: str, slurm_version: tuple[int, int] | None) -> Form:
    """The form asked for, refused where the cluster's Slurm cannot read it (None: no Slurm known here)."""
    if form not in FORMS:
        raise UsageError(f"--form {form!r} is not one of {', '.join(FORMS)}", fix="use --form tree or --form block")
    if form == "block" and slurm_version is not None and slurm_version < BLOCK_MIN_SLURM:
        raise UsageError(f"--form block: Slurm {slurm_version[0]}.{slurm_version[1]:02d} has no topology/block "
                         f"(Slurm >= {BLOCK_MIN_SLURM[0]}.{BLOCK_MIN_SLURM[1]})", fix="use --form tree")
    return form  # type: ignore[return-value]


def order_from_conf(text: str, source: str = "<topology.conf>") -> list[str]:
    """The nodes of a topology.conf (either form) in network order: the switches' tree walked from its roots,
    children as listed (what `hpc cluster topology` writes is in network order already), blocks as listed."""
    switches: dict[str, dict[str, str]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        fields = {key.lower(): value for key, value in fields.items()}
        name = fields.get("switchname") or fields.get("blockname")
        if not name:
            if "blocksizes" in fields:
                continue
            raise UsageError(f"{source}:{number}: not a SwitchName= or BlockName= line: {raw.strip()!r}",
                             fix="write the file with `hpc cluster topology` (topology.conf(5))")
        switches[name] = fields
    below = {child for fields in switches.values() for child in expand_hostlist(fields.get("switches", ""))}
    order: list[str] = []

    def walk(name: str) -> None:
        fields = switches.get(name, {})
        for node in expand_hostlist(fields.get("nodes", "")):
            if node not in order:
                order.append(node)
        for child in expand_hostlist(fields.get("switches", "")):
            walk(child)
    for name in switches:
        if name not in below:
            walk(name)
    if not order:
        raise UsageError(f"{source}: names no nodes", fix="write it with `hpc cluster topology`")
    return order
