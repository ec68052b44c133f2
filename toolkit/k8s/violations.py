"""A finding about one field of a Kubernetes object: its path and what the API server (or an operator) says.

Shared by the CRD validator (toolkit.k8s.crd), the core schemas (toolkit.k8s.coreschema) and the admission rules
(toolkit.k8s.admission), so their findings read alike: `spec.x.containers[0].args[5]: must be a string, ...`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

UNKNOWN_FIELD = ("unknown field: the API server rejects it under kubectl's --validate=strict (its default), drops "
                 "it otherwise")
UNKNOWN_FIELD_FIX = "remove the key, or fix its spelling or indentation (see the kind's API reference)"


def key_path(parts) -> str:
    """spec.template.containers[0].resources.limits["vpc.amazonaws.com/efa"]"""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z0-9_-]+", str(part)):
            text += f".{part}" if text else str(part)
        else:
            text += f'["{part}"]'
    return text



@dataclasses.dataclass(frozen=True)
class Violation:
    """One thing the API server (or the schema's unevaluated rules) says about a field."""

    parts: tuple  # the field's path: keys and list indices
    message: str
    level: str = "error"  # "info": a rule not evaluated offline
    fix: str | None = None
    rule: str | None = None  # the CEL rule an "info" note says was not evaluated

    @property
    def path(self) -> str:
        return key_path(self.parts) or "(document)"

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"



def type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", list: "array", dict: "object", type(None): "null"}[type(value)]


TYPE_PHRASE = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "a boolean",
            "array": "a list", "object": "a mapping"}


def describe_value(value: Any) -> str:
    import json

    shown = json.dumps(value)
    return f"the {type_name(value)} {shown if len(shown) <= 40 else shown[:37] + '...'}"


def type_violation(parts: tuple, wanted: str, value: Any) -> Violation:
    """`value` is not of the type the schema wants (`wanted`: "a string", ...)."""
    quote = wanted.endswith("a string") and not isinstance(value, (dict, list))
    return Violation(parts, f"must be {wanted}, not {describe_value(value)}",
                     fix="quote the value in the YAML: kubectl's reader (go-yaml v2) takes unquoted 1e-4, 1e-06, "
                         "y, on, no, ~, 0o17 for numbers, booleans or null" if quote else None)


