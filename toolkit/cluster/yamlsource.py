"""Read a cluster config's YAML strictly: duplicate keys and syntax errors become findings with a line,
and every key path (queues and compute resources by name) keeps the line it came from.

A loader of our own, so pcluster's habit of changing PyYAML's global SafeLoader never touches us.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from toolkit.cluster.findings import Finding


# libyaml's parser where PyYAML has it (its wheels do): the same events, marks and errors as the pure-Python one,
# ~10x faster; a cluster config is read on every submit (0.04 s of `hpc recipes submit` here with the pure one).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TEMPLATE_MARKUP = re.compile(r"\{\{.*?\}\}|\{%.*?%\}")


class StrictLoader(_SAFE_LOADER):  # type: ignore[valid-type,misc]
    """SafeLoader that refuses duplicate keys (YAML allows them; the later one would silently win)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: SafeLoader reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _item_label(node: yaml.Node, index: int) -> str:
    """A list item is named by its Name (queues, compute resources, storage), else by its index."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if key.value == "Name" and isinstance(value, yaml.ScalarNode) and value.value:
                return value.value
    return str(index)


def _lines(node: yaml.Node, path: str, out: dict[str, int]) -> None:
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            child = f"{path}/{key.value}" if path else str(key.value)
            out[child] = key.start_mark.line + 1
            _lines(value, child, out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _lines(item, f"{path}[{_item_label(item, index)}]", out)


def parse(text: str, file: str) -> tuple[dict | None, dict[str, int], list[Finding]]:
    """(config mapping or None, line of each key path, findings for anything that stops reading)."""
    def fail(message: str, fix: str, line: int | None = None):
        return None, {}, [Finding("error", "", message, fix, file=file, line=line, source="yaml")]

    loader = StrictLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or str(exc)
        line = mark.line + 1 if mark else None
        if _TEMPLATE_MARKUP.search(text):  # a template (pcluster's own test configs are Jinja), not yet rendered
            return fail(f"not valid YAML: {problem}; the file holds template markup ({{{{ ... }}}} or {{% ... %}})",
                        "render the template with its tool first (e.g. Jinja), then pass the result", line)
        return fail(f"not valid YAML: {problem}", "fix the YAML at that line (indentation, quotes, a missing ':')",
                    line)
    except yaml.YAMLError as exc:
        return fail(f"not valid YAML: {exc}", "fix the YAML syntax")
    finally:
        loader.dispose()
    if node is None or data is None:  # no document, or one that is only `null`
        return fail("the file is empty", "write a ParallelCluster v3 config, e.g. with `hpc cluster config`")
    if not isinstance(data, dict):
        return fail(f"a cluster config is a mapping of sections, this file holds a {type(data).__name__}",
                    "start from `hpc cluster config` output: Region, Image, HeadNode, Scheduling, ...", 1)
    lines: dict[str, int] = {}
    _lines(node, "", lines)
    return data, lines, []
