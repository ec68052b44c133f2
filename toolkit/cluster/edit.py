"""`hpc cluster queue add|set|remove`: edit the queues of a live cluster's config in place.

The file is changed by text splices at the positions ruamel.yaml's round-trip parser gives (a full ruamel dump
re-indents and re-spaces comments), so every byte outside the edited queue or value stays as it was: comments,
order, quoting, indentation style. Each edit is checked twice before the file is replaced (atomically):
the new text must parse to exactly the mapping the edit means, and toolkit.cluster.validate must find no error
the file did not already have. Any failure leaves the file untouched and says why.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from toolkit.catalog import instance
from toolkit.cluster import flags, yamlsource
from toolkit.cluster.build import QueueSpec, parse_queue
from toolkit.cluster.configfile import read_config
from toolkit.cluster.queues import TAG_EFA_STACK, TAG_RANKS_PER_NODE
from toolkit.errors import HpcError, UsageError

DEFAULT_MAX_COUNT = 10  # pcluster's MaxCount when a compute resource leaves it out
HAND_FIX = "make this change by hand in an editor, then check it with `hpc cluster validate FILE`"


@dataclasses.dataclass
class EditResult:
    file: str
    action: str  # add | set | remove
    queue: str
    changes: list[str]  # what changed, one line each
    diff: str  # unified diff of the file
    written: bool  # False on --dry-run, and when the file already had these values
    warnings: list[str]
    notes: list[str] = dataclasses.field(default_factory=list)  # why nothing changed; what was not checked offline
    errors_before: int = 0  # validation errors the file had before the edit (the edit adds none)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class _Layout(Exception):
    """The file's layout at the edit point is one the splicer does not handle (said in the message)."""


def _ruamel_doc(text: str):
    from ruamel.yaml import YAML

    return YAML(typ="rt").load(text)


def _is_content(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _item_lines(lines: list[str], seq, index: int) -> tuple[int, int, int]:
    """(first line, end line, dash column) of a block sequence item, with the comments just above it (they
    introduce it) and the deeper-indented comments at its end; comments at or left of its dash belong to
    what follows."""
    start, col = seq.lc.item(index)
    before = lines[start][:col]
    if before.strip() != "-":
        raise _Layout(f"line {start + 1}: list item not written as '- key: value' on one line")
    dash = before.index("-")
    end = start + 1
    while end < len(lines) and not (_is_content(lines[end]) and _indent(lines[end]) <= dash):
        end += 1
    while end > start + 1 and (not lines[end - 1].strip()
                               or (lines[end - 1].lstrip().startswith("#") and _indent(lines[end - 1]) <= dash)):
        end -= 1
    lead = start
    while lead > 0 and lines[lead - 1].lstrip().startswith("#") and _indent(lines[lead - 1]) <= dash:
        lead -= 1
    return lead, end, dash


def _value_end(line: str, col: int) -> int:
    """Column just past the scalar that starts at `col` (plain, single- or double-quoted, on one line)."""
    quote = line[col:col + 1]
    if quote in ("'", '"'):
        i = col + 1
        while i < len(line):
            if line[i] == quote:
                if quote == "'" and line[i + 1:i + 2] == "'":
                    i += 2
                    continue
                return i + 1
            i += 2 if quote == '"' and line[i] == "\\" else 1
        raise _Layout("a quoted value that runs over several lines")
    end = len(line.rstrip("\r\n"))
    for stop in (" #", "\t#", ",", "}", "]"):  # a comment, or the end of a flow-style item
        found = line.find(stop, col)
        if found >= 0:
            end = min(end, found)
    return col + len(line[col:end].rstrip())


def _set_scalar(lines: list[str], mapping, key: str, value: Any) -> None:
    """Replace the value of `key` in `mapping` in place, keeping its quoting and any comment after it."""
    row, col = mapping.lc.value(key)
    if isinstance(mapping[key], (dict, list)):
        raise _Layout(f"line {row + 1}: {key} holds a mapping or list, not a value")
    _replace_value(lines, row, col, value)


def _set_item(lines: list[str], seq, index: int, value: Any) -> None:
    """Replace the scalar item `index` of a list (block or flow style) in place, keeping its quoting."""
    row, col = seq.lc.item(index)
    if isinstance(seq[index], (dict, list)):
        raise _Layout(f"line {row + 1}: the list item is a mapping or list, not a value")
    _replace_value(lines, row, col, value)


def _replace_value(lines: list[str], row: int, col: int, value: Any) -> None:
    line = lines[row]
    end = _value_end(line, col)
    quote = line[col] if line[col:col + 1] in ("'", '"') else ""
    lines[row] = f"{line[:col]}{quote}{value}{quote}{line[end:]}"


def _insert_key(lines: list[str], mapping, key: str, value: Any, before: str, after: str, nl: str) -> None:
    """Add `key: value` to a block mapping: on the line of `before` if it is there (pushing it down), else
    right after the line of `after`."""
    if mapping.fa.flow_style():
        raise _Layout(f"{key} would go into a flow-style mapping {{...}}")
    anchor = before if before in mapping else after
    row, col = mapping.lc.key(anchor)
    lines.insert(row if anchor == before else row + 1, f"{' ' * col}{key}: {value}{nl}")


def _find_queue(config: dict, name: str) -> tuple[int, dict]:
    queues = ((config.get("Scheduling") or {}).get("SlurmQueues") or [])
    for index, queue in enumerate(queues):
        if isinstance(queue, dict) and queue.get("Name") == name:
            return index, queue
    names = [q.get("Name") for q in queues if isinstance(q, dict)]
    raise UsageError(f"no queue {name!r} in Scheduling/SlurmQueues",
                   fix=f"queues in this file: {', '.join(map(str, names)) or 'none'}")


def _render_item(item: dict, mapping: int, parent: int, dash: int, content: int, nl: str) -> list[str]:
    """One new sequence item as lines in the file's style: the list's key at column `parent`, the item's dash
    at `dash`, its keys at `content` (nested lists alike)."""
    import io

    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.width = 4096
    yaml.indent(mapping=mapping, sequence=content - parent, offset=dash - parent)
    out = io.StringIO()
    yaml.dump([item], out)  # a top-level list: its dash lands at column `offset`
    return [f"{' ' * parent}{line}{nl}" for line in out.getvalue().splitlines()]


def _tag_queues(config: dict) -> bool:
    """Does the file carry the toolkit's queue tags (so a new queue gets them too)?"""
    return any(tag.get("Key") == TAG_EFA_STACK for queue in config["Scheduling"]["SlurmQueues"]
               for tag in (queue.get("Tags") or []) if isinstance(tag, dict))


def new_queue(config: dict, spec: QueueSpec, min_nodes: int | None, capacity_block: str | None,
              subnet: str | None = None) -> dict:
    """The mapping of a new queue for this cluster: its subnet (`subnet`, else the first queue's subnets), EFA and
    a placement group when the catalog says the type has EFA, a Capacity Block as pcluster 3.16 wants one.
    spec comes from parse_queue: its instance type is in the catalog."""
    first = config["Scheduling"]["SlurmQueues"][0]
    subnets = [subnet] if subnet else (first.get("Networking") or {}).get("SubnetIds")
    if not subnets:
        raise HpcError("the first queue has no Networking/SubnetIds to copy for the new queue",
                       fix="give the new queue's subnet with --subnet subnet-...")
    it = instance(spec.instance_type)
    minimum = spec.max_nodes if capacity_block and min_nodes is None else (min_nodes or 0)
    if minimum > spec.max_nodes:
        raise UsageError(f"--min {minimum} is above the queue's MAX {spec.max_nodes}", fix="use --min <= MAX")
    if capacity_block and minimum != spec.max_nodes:
        raise UsageError(f"a Capacity Block queue runs all its nodes: --min {minimum} must equal MAX "
                         f"{spec.max_nodes}", fix="drop --min (it defaults to MAX with --capacity-block)")
    resource: dict[str, Any] = {"Name": spec.instance_type.replace(".", "-"), "InstanceType": spec.instance_type,
                                "MinCount": minimum, "MaxCount": spec.max_nodes}
    if it.has_efa:  # EFA on wherever the instance has it, as `hpc cluster config` writes it
        resource["Efa"] = {"Enabled": True}
    if capacity_block:  # the block brings its own placement: no placement group
        resource["CapacityReservationTarget"] = {"CapacityReservationId": capacity_block}
        if it.has_efa:
            resource["Networking"] = {"PlacementGroup": {"Enabled": False}}
    elif it.has_efa:
        resource["Networking"] = {"PlacementGroup": {"Enabled": True}}
    queue: dict[str, Any] = {"Name": spec.name, "CapacityType": "CAPACITY_BLOCK" if capacity_block else "ONDEMAND"}
    if it.accelerator != "none":
        queue["JobExclusiveAllocation"] = True
    queue["Networking"] = {"SubnetIds": list(subnets)}
    queue["ComputeResources"] = [resource]
    if _tag_queues(config) or spec.efa_stack or spec.ranks_per_node:
        stack = spec.efa_stack or ("modern" if it.has_efa else "none")
        queue["Tags"] = [{"Key": TAG_EFA_STACK, "Value": stack}] + (
            [{"Key": TAG_RANKS_PER_NODE, "Value": str(spec.ranks_per_node)}] if spec.ranks_per_node else [])
    return queue


def _edit(path: str | Path, action: str, queue: str, splice: Callable, dry_run: bool) -> EditResult:
    """Read, splice, check (meaning, then validation), then replace the file atomically unless dry_run.
    `splice(lines, rt_doc, expected, nl)` edits the lines and the expected mapping alike; returns (changes,
    warnings)."""
    from toolkit.cluster.validate import validate_config

    path = Path(path)
    text, config = read_config(path)
    target = Path(os.path.realpath(path))  # a symlinked config: the file it points to is edited, the link stays
    scheduling = config.get("Scheduling")
    queues = scheduling.get("SlurmQueues") if isinstance(scheduling, dict) else None
    if not isinstance(queues, list) or not queues:
        raise HpcError(f"{path} has no Scheduling/SlurmQueues list",
                       fix="pass a ParallelCluster v3 config with Slurm queues")
    lines = text.splitlines(keepends=True)
    unterminated = bool(lines) and not lines[-1].endswith("\n")
    if unterminated:
        lines[-1] += "\n"  # the splices work on whole lines; the file's missing last newline is kept below
    nl = "\r\n" if "\r\n" in text else "\n"  # new lines end the way the file's lines do
    expected = copy.deepcopy(config)
    try:
        changes, warnings = splice(lines, _ruamel_doc(text), expected, nl)
    except _Layout as exc:
        raise HpcError(f"{path}: cannot edit this file in place without changing its layout: {exc}",
                       fix=HAND_FIX) from None
    if not changes:  # the file already says this: nothing to check or write
        return EditResult(str(path), action, queue, [], "", False, warnings,
                          [f"queue {queue} already has these values: the file was not changed"])
    new_text = "".join(lines)
    if unterminated:
        new_text = new_text.rstrip("\r\n")
    got, _, problems = yamlsource.parse(new_text, str(path))
    if problems or got != expected:
        raise HpcError(f"{path}: the in-place edit did not give the intended config (the layout here is one the "
                       "editor does not handle); the file was not changed", fix=HAND_FIX)
    old_findings = validate_config(config, str(path)).findings
    before = {(f.path, f.message) for f in old_findings if f.level == "error"}
    report = validate_config(got, str(path))
    new_errors = [f for f in report.findings if f.level == "error" and (f.path, f.message) not in before]
    if new_errors:
        details = "; ".join(f"{f.path or '(file)'}: {f.message}" for f in new_errors[:5])
        raise HpcError(f"{path}: the edit would make the config invalid, so the file was not changed: {details}",
                       fix=new_errors[0].fix or "change the edit's values (see `hpc cluster validate`)")
    if before:
        warnings.append(f"{path} already had {len(before)} validation error(s) before this edit; see "
                        "`hpc cluster validate`")
    # what `hpc cluster validate` warns about that this edit brought in (e.g. an EFA queue on the head node's
    # subnet), and what it could not check offline about the edited queue
    known = {(f.path, f.message) for f in old_findings}
    warnings += [f"{f.path}: {f.message}" + (f" (fix: {f.fix})" if f.fix else "") for f in report.findings
                 if f.level == "warning" and (f.path, f.message) not in known]
    notes = [f"not checked offline: whether subnet {', '.join(report.subnets_unchecked[queue])} of queue {queue} "
             "auto-assigns public IPs; its nodes get several network interfaces (EFA), so it must be a private subnet "
             "with a NAT gateway, or `pcluster update-cluster` fails"] if queue in report.subnets_unchecked else []
    diff = "".join(difflib.unified_diff(text.splitlines(keepends=True), new_text.splitlines(keepends=True),
                                        f"a/{path}", f"b/{path}"))
    if not dry_run:
        tmp = target.with_name(f".{target.name}.hpc-edit.tmp")
        try:
            tmp.write_bytes(new_text.encode("utf-8"))
            shutil.copymode(target, tmp)
            os.replace(tmp, target)  # atomic: readers see the old file or the new one, never half of it
        finally:
            tmp.unlink(missing_ok=True)
    return EditResult(str(path), action, queue, changes, diff, not dry_run, warnings, notes, len(before))


def add_queue(path: str | Path, queue: str, min_nodes: int | None = None, capacity_block: str | None = None,
              dry_run: bool = False, subnet: str | None = None) -> EditResult:
    """Append a queue (`NAME=TYPE:MAX[,efa-stack=...][,ranks-per-node=N]`) after the last one, in `subnet` (default:
    the first queue's subnets)."""
    spec = parse_queue(queue)
    if subnet is not None:
        flags.subnet_id(subnet, "--subnet")
    if capacity_block is not None:
        flags.reservation_id(capacity_block, "--capacity-block")

    def splice(lines, doc, expected, nl):
        queues = expected["Scheduling"]["SlurmQueues"]
        if any(isinstance(q, dict) and q.get("Name") == spec.name for q in queues):
            raise HpcError(f"queue {spec.name!r} already exists", fix=f"change it with `hpc cluster queue set "
                           f"FILE {spec.name} ...`, or pick another name")
        item = new_queue(expected, spec, min_nodes, capacity_block, subnet)
        rt_queues = doc["Scheduling"]["SlurmQueues"]
        if rt_queues.fa.flow_style():
            raise _Layout("SlurmQueues is written in flow style [...]")
        lead, end, dash = _item_lines(lines, rt_queues, len(rt_queues) - 1)
        content = rt_queues.lc.item(0)[1]
        mapping = _mapping_indent(rt_queues)
        parent = doc["Scheduling"].lc.key("SlurmQueues")[1]
        new_lines = _render_item(item, mapping, parent, dash, content, nl)
        if lead > 0 and not lines[lead - 1].strip():  # the file separates queues by a blank line
            new_lines.insert(0, nl)
        lines[end:end] = new_lines
        queues.append(item)
        nodes = f"{item['ComputeResources'][0]['MinCount']}-{spec.max_nodes}"
        return [f"added queue {spec.name}: {spec.instance_type}, {nodes} nodes, subnet "
                + ", ".join(item["Networking"]["SubnetIds"])
                + (", EFA" if "Efa" in item["ComputeResources"][0] else "")
                + (f", Capacity Block {capacity_block}" if capacity_block else "")], []
    return _edit(path, "add", spec.name, splice, dry_run)


def _mapping_indent(rt_queues) -> int:
    """How far the file indents a nested mapping's keys under their parent key (2 unless it says otherwise)."""
    from ruamel.yaml.comments import CommentedMap

    for queue in rt_queues:
        for key, value in queue.items():
            if isinstance(value, CommentedMap) and len(value) and not value.fa.flow_style():
                return value.lc.key(next(iter(value)))[1] - queue.lc.key(key)[1]
    return 2


def set_queue(path: str | Path, name: str, max_nodes: int | None = None, min_nodes: int | None = None,
              instance_type: str | None = None, compute_resource: str | None = None,
              dry_run: bool = False, subnet: str | None = None) -> EditResult:
    """Change MaxCount, MinCount or the instance type of one compute resource of a queue, or the queue's subnet.
    A new instance type with EFA gets EFA (and a placement group) where the compute resource has none."""
    if max_nodes is None and min_nodes is None and instance_type is None and subnet is None:
        raise UsageError("nothing to change", fix="give --max N, --min N, --instance TYPE or --subnet SUBNET_ID")
    new_type, facts = flags.queue_instance_type(instance_type, "--instance") if instance_type is not None else (None,
                                                                                                             None)
    if subnet is not None:
        flags.subnet_id(subnet, "--subnet")

    def splice(lines, doc, expected, nl):
        index, queue = _find_queue(expected, name)
        rt_queue = doc["Scheduling"]["SlurmQueues"][index]
        changes: list[str] = []
        if subnet is not None:
            changes += _set_subnet(lines, queue, rt_queue, subnet)
        if max_nodes is None and min_nodes is None and new_type is None:
            return changes, []
        resources = [r for r in queue.get("ComputeResources") or [] if isinstance(r, dict)]
        if compute_resource is None and len(resources) != 1:
            raise UsageError(f"queue {name!r} has {len(resources)} compute resources",
                             fix="name one with --compute-resource "
                                 f"({', '.join(str(r.get('Name')) for r in resources)})")
        chosen = next((i for i, r in enumerate(queue["ComputeResources"])
                       if compute_resource is None or r.get("Name") == compute_resource), None)
        if chosen is None:
            raise HpcError(f"queue {name!r} has no compute resource {compute_resource!r}",
                           fix=f"use one of: {', '.join(str(r.get('Name')) for r in resources)}")
        resource = queue["ComputeResources"][chosen]
        rt_resource = rt_queue["ComputeResources"][chosen]
        where = f"{name}/{resource.get('Name')}"
        counts = {"MaxCount": max_nodes, "MinCount": min_nodes}
        if queue.get("CapacityType") == "CAPACITY_BLOCK" and (max_nodes is None) != (min_nodes is None):
            counts["MinCount"] = counts["MaxCount"] = max_nodes if max_nodes is not None else min_nodes
        for key, value in counts.items():
            if value is None or resource.get(key) == value:
                continue
            if value < 0:
                raise UsageError(f"{key} {value} is negative", fix="give 0 or more")
            changes.append(f"{where}: {key} {resource.get(key, '(default)')} -> {value}")
            if key in resource:
                _set_scalar(lines, rt_resource, key, value)
            else:
                _insert_key(lines, rt_resource, key, value, before="MaxCount", after="Name", nl=nl)
            resource[key] = value
        if resource.get("MinCount", 0) > resource.get("MaxCount", DEFAULT_MAX_COUNT):
            raise UsageError(f"{where}: MinCount {resource.get('MinCount', 0)} would be above MaxCount "
                             f"{resource.get('MaxCount', DEFAULT_MAX_COUNT)}", fix="keep --min <= --max")
        if new_type is not None:
            if "InstanceType" in resource:
                holder, rt_holder = resource, rt_resource
            elif len(resource.get("Instances") or []) == 1:
                holder, rt_holder = resource["Instances"][0], rt_resource["Instances"][0]
            else:
                raise HpcError(f"{where} lists several instance types (Instances)", fix=HAND_FIX)
            if holder.get("InstanceType") != new_type:
                changes.append(f"{where}: InstanceType {holder.get('InstanceType')} -> {new_type}")
                _set_scalar(lines, rt_holder, "InstanceType", new_type)
                holder["InstanceType"] = new_type
                # a type outside the catalog (a CPU type: queue_instance_type) gets no EFA: nothing says it has any
                if facts is not None and facts.has_efa and "Efa" not in resource:
                    changes += _enable_efa(lines, queue, resource, rt_resource, where, nl)
        return changes, []
    return _edit(path, "set", name, splice, dry_run)


def _set_subnet(lines: list[str], queue: dict, rt_queue, subnet: str) -> list[str]:
    """The queue's one subnet (Networking/SubnetIds) becomes `subnet`."""
    subnets = (queue.get("Networking") or {}).get("SubnetIds")
    if not isinstance(subnets, list) or len(subnets) != 1:
        raise HpcError(f"queue {queue.get('Name')!r} has {len(subnets) if isinstance(subnets, list) else 'no'} "
                       "Networking/SubnetIds entries; --subnet replaces exactly one", fix=HAND_FIX)
    if subnets[0] == subnet:
        return []
    _set_item(lines, rt_queue["Networking"]["SubnetIds"], 0, subnet)
    queue["Networking"]["SubnetIds"] = [subnet]
    return [f"{queue.get('Name')}: Networking/SubnetIds [{subnets[0]}] -> [{subnet}]"]


def _enable_efa(lines: list[str], queue: dict, resource: dict, rt_resource, where: str, nl: str) -> list[str]:
    """EFA on for a compute resource whose new instance type has it, as `hpc cluster config` and `queue add` write
    it: Efa/Enabled, and a placement group where neither the resource nor its queue declares one (pcluster's
    EfaPlacementGroupValidator wants it explicit; off when a reservation or Capacity Block brings its own)."""
    after = next(key for key in ("MaxCount", "MinCount", "InstanceType", "Name") if key in resource)
    changes = []
    declared = ((resource.get("Networking") or {}).get("PlacementGroup")
                or (queue.get("Networking") or {}).get("PlacementGroup"))
    if declared is None and "Networking" not in resource:  # (inserted first: it lands below the Efa line)
        own = not (resource.get("CapacityReservationTarget") or queue.get("CapacityReservationTarget")
                   or queue.get("CapacityType") == "CAPACITY_BLOCK")
        _insert_key(lines, rt_resource, "Networking", f"{{PlacementGroup: {{Enabled: {str(own).lower()}}}}}",
                    before="Networking", after=after, nl=nl)
        resource["Networking"] = {"PlacementGroup": {"Enabled": own}}
        changes.append(f"{where}: Networking/PlacementGroup/Enabled (absent) -> {str(own).lower()}")
    _insert_key(lines, rt_resource, "Efa", "{Enabled: true}", before="Networking", after=after, nl=nl)
    resource["Efa"] = {"Enabled": True}
    return [f"{where}: Efa/Enabled (absent) -> true (the instance type has EFA)", *changes]


def remove_queue(path: str | Path, name: str, dry_run: bool = False) -> EditResult:
    """Remove a queue with the comments that introduce it."""
    def splice(lines, doc, expected, nl):
        index, _ = _find_queue(expected, name)
        queues = expected["Scheduling"]["SlurmQueues"]
        if len(queues) == 1:
            raise HpcError(f"{name!r} is the cluster's only queue: ParallelCluster needs at least one",
                           fix="add the queue that replaces it first (`hpc cluster queue add`)")
        rt_queues = doc["Scheduling"]["SlurmQueues"]
        if rt_queues.fa.flow_style():
            raise _Layout("SlurmQueues is written in flow style [...]")
        lead, end, _ = _item_lines(lines, rt_queues, index)
        blank_before = lead > 0 and not lines[lead - 1].strip()
        blank_after = end < len(lines) and not lines[end].strip()
        if blank_before and (blank_after or index == len(queues) - 1):
            lead -= 1  # the blank line that separated it goes with it
        elif blank_after and not blank_before and index < len(queues) - 1:
            end += 1  # (after the last queue, a blank line separates the list from what follows: it stays)
        del lines[lead:end]
        del queues[index]
        return [f"removed queue {name}"], []
    return _edit(path, "remove", name, splice, dry_run)
