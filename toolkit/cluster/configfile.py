"""Read a ParallelCluster v3 config file that a command will edit or compare: its text and its mapping, or one
clear error (missing file, bad YAML, a `${VAR}` a template tool was meant to fill in)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

from toolkit.cluster import yamlsource
from toolkit.errors import HpcError
from toolkit.textfile import read_text

_VARIABLE = re.compile(r"\$\{([^}]*)\}")


def _scalars(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _scalars(value, f"{path}/{key}" if path else str(key))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            name = item.get("Name") if isinstance(item, dict) else None
            yield from _scalars(item, f"{path}[{name if isinstance(name, str) else index}]")
    elif isinstance(node, str):
        yield path, node


def read_config(path: str | Path) -> tuple[str, dict]:
    """(text, config mapping) of a config file. Raises HpcError when it cannot be read, is not YAML, or still
    holds a `${VAR}` (AWS samples are templates for envsubst: the value would reach pcluster literally)."""
    path = Path(path)
    text = read_text(path, "cluster config", fix="pass the path of a ParallelCluster v3 config file")
    config, lines, problems = yamlsource.parse(text, str(path))
    if problems:
        problem = problems[0]
        where = f"{path}:{problem.line}" if problem.line else str(path)
        raise HpcError(f"{where}: {problem.message}", fix=problem.fix)
    assert config is not None, "yamlsource.parse reports a problem whenever it returns no config"
    for key_path, value in _scalars(config):
        variable = template_variable(value)
        if variable is not None:
            line = lines.get(key_path)
            raise template_error(f"{path}{f':{line}' if line else ''}: {key_path}", variable, path)
    return text, config


TEMPLATE_WORDS = "holds the variable ${{{}}}, left in for a template tool to fill in"


def template_variable(value: Any) -> str | None:
    """The name of the first `${VAR}` in a value, or None (not a string, or none in it)."""
    match = _VARIABLE.search(value) if isinstance(value, str) else None
    return match.group(1) if match else None


def template_variables(config: dict) -> dict[str, str]:
    """Each key path whose value holds a `${VAR}`, with the variable's name."""
    return {key_path: name for key_path, value in _scalars(config) if (name := template_variable(value)) is not None}


def template_error(what: str, variable: str, path: str | Path) -> HpcError:
    """`what` (where the value is, in the user's terms) holds `${variable}`: substitute the template first."""
    return HpcError(f"{what} {TEMPLATE_WORDS.format(variable)}", fix=template_fix(variable, path))


def template_fix(variable: str, path: str | Path) -> str:
    return (f"substitute it first, e.g. `export {variable or 'VAR'}=...; envsubst < {path} > cluster.yaml`, and "
            "pass the result")
