"""YAML as kubectl reads it, and YAML that every reader reads the same way.

kubectl turns a manifest into JSON with sigs.k8s.io/yaml (`YAMLToJSON`, kubernetes-sigs/yaml yaml.go), which
parses with go-yaml v2 (go.yaml.in/yaml/v2, the go-yaml/yaml v2 branch) into plain Go values, no target type:
a plain scalar resolves by go-yaml v2's rules (resolve.go, `resolve`), not PyYAML's. They differ: go-yaml v2
reads `1e-4` as a float (PyYAML's YAML 1.1 float needs a dot), `y`/`n` as booleans, `0o17` as an integer;
timestamps stay strings (decode.go: kept as strings when decoding into interface{}). The API server then decodes
the JSON: a number whose text parses as an int64 is an integer, any other a float (k8s.io/apimachinery
pkg/util/json `convertNumber`), and Go's encoding/json writes an integral float64 below 1e21 without a
fraction: `3.0` arrives as the integer 3, `1e6` as 1000000.

`load_all` reads a manifest into exactly the JSON values the API server sees. `dump_all` writes documents so
that every string reads back as that string under both rule sets (and YAML 1.1's own, e.g. sexagesimal `1:30`):
anything one of them would take for a number, boolean, null or timestamp is quoted.
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml

_TAG = "tag:yaml.org,2002:"
STR, INT, FLOAT, BOOL, NULL, TIMESTAMP, MERGE = (_TAG + t for t in ("str", "int", "float", "bool", "null",
                                                                      "timestamp", "merge"))
# go-yaml v2 resolve.go: resolveMap (words), resolveTable (the first byte that may start a non-string).
_WORDS: dict[str, tuple[str, Any]] = {
    **{w: (BOOL, True) for w in ("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON")},
    **{w: (BOOL, False) for w in ("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF")},
    **{w: (NULL, None) for w in ("", "~", "null", "Null", "NULL")},
    **{w: (FLOAT, math.nan) for w in (".nan", ".NaN", ".NAN")},
    **{w: (FLOAT, math.inf) for w in (".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF")},
    **{w: (FLOAT, -math.inf) for w in ("-.inf", "-.Inf", "-.INF")},
    "<<": (MERGE, "<<"),
}
_HINTS = set("+-0123456789yYnNtTfFoO~.")
_YAML_STYLE_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")  # resolve.go yamlStyleFloat
# what Go's strconv.ParseFloat takes after a leading dot: a Go float literal, underscores between digits allowed
_DOT_FLOAT = re.compile(r"\.[0-9](_?[0-9])*([eE][-+]?[0-9](_?[0-9])*)?")
# resolve.go parseTimestamp: four digits and a dash, then Go layouts with one- or two-digit fields
_GO_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}"
                           r"(([Tt][0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2}(\.[0-9]*)?(Z|[-+][0-9]{2}:[0-9]{2}))"
                           r"|( [0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2}(\.[0-9]*)?))?")
_INT64 = (-(1 << 63), (1 << 63) - 1)
_DIGITS = {2: "01", 8: "01234567", 10: "0123456789", 16: "0123456789abcdefABCDEF"}


def _go_parse_int(text: str, signed: bool) -> int | None:
    """Go's strconv.ParseInt(text, 0, 64) (signed) or ParseUint(text, 0, 64): base from the prefix."""
    sign, body = 1, text
    if signed and body and body[0] in "+-":
        sign, body = (-1 if body[0] == "-" else 1), body[1:]
    base = 10
    if body[:2].lower() in ("0x", "0o", "0b"):
        base, body = {"x": 16, "o": 8, "b": 2}[body[1].lower()], body[2:]
    elif len(body) > 1 and body[0] == "0":
        base, body = 8, body[1:]
    if not body or any(c not in _DIGITS[base] for c in body):
        return None
    value = sign * int(body, base)
    low, high = _INT64 if signed else (0, (1 << 64) - 1)
    return value if low <= value <= high else None


def _go_parse_float(text: str) -> float | None:
    """Go's strconv.ParseFloat for the decimal forms resolve.go hands it; out of range is an error there."""
    value = float(text.replace("_", ""))
    return None if math.isinf(value) else value


def go_yaml_v2_resolve(text: str) -> tuple[str, Any]:
    """(tag, value) of a plain scalar under go-yaml v2's resolve(): STR, INT, FLOAT, BOOL, NULL, TIMESTAMP
    (value: the text; kubectl keeps it a string) or MERGE."""
    if text in _WORDS:
        return _WORDS[text]
    first = text[:1]
    if first not in _HINTS or first in "yYnNtTfFoO~":
        return STR, text
    if first == ".":
        return (FLOAT, _go_parse_float(text)) if _DOT_FLOAT.fullmatch(text) and _go_parse_float(text) is not None \
            else (STR, text)
    if _GO_TIMESTAMP.fullmatch(text):
        return TIMESTAMP, text
    plain = text.replace("_", "")
    for signed in (True, False):
        value = _go_parse_int(plain, signed)
        if value is not None:
            return INT, value
    if _YAML_STYLE_FLOAT.fullmatch(plain) and _go_parse_float(plain) is not None:
        return FLOAT, _go_parse_float(plain)
    return STR, text


class KubectlYamlError(ValueError):
    """A manifest kubectl would refuse (or that cannot reach the API server as JSON): message and 1-based line."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.message, self.line = message, line


_BASE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _KubectlLoader(_BASE_LOADER):  # type: ignore[misc,valid-type]
    """PyYAML's parser with go-yaml v2's scalar resolution (explicit tags resolve their text by the same rules)."""

    yaml_implicit_resolvers: dict = {}

    def resolve(self, kind, value, implicit):
        if kind is yaml.ScalarNode and implicit[0]:
            return go_yaml_v2_resolve(value)[0]
        return super().resolve(kind, value, implicit)

    def _resolved(self, node, tag: str):
        rtag, value = go_yaml_v2_resolve(node.value)
        if rtag == INT and tag == FLOAT:  # resolve.go: an int under !!float becomes a float
            return float(value)
        if rtag != tag:
            raise yaml.constructor.ConstructorError(None, None, f"cannot decode {rtag[len(_TAG):]} "
                                                    f"`{node.value}` as a {tag[len(_TAG):]}", node.start_mark)
        return _NonFinite(value, node) if isinstance(value, float) and not math.isfinite(value) else value


class _NonFinite(float):
    """An infinity or NaN, with where it was written: fine as a key (sigs.k8s.io/yaml spells it), not as a value."""

    text: str  # as written
    line: int

    def __new__(cls, value: float, node):
        self = super().__new__(cls, value)
        self.text, self.line = node.value, node.start_mark.line + 1
        return self


for _tag in (INT, FLOAT, BOOL, NULL):
    _KubectlLoader.add_constructor(_tag, lambda loader, node, tag=_tag: loader._resolved(node, tag))
_KubectlLoader.add_constructor(TIMESTAMP, lambda loader, node: node.value)
_KubectlLoader.add_constructor(MERGE, lambda loader, node: node.value)  # `<<` as a value is the string


def _json_key(key: Any) -> str:
    """A mapping key as sigs.k8s.io/yaml makes it a JSON key (convertToJSONableObject)."""
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    if isinstance(key, float) and not math.isfinite(key):
        return ".nan" if math.isnan(key) else ".inf" if key > 0 else "-.inf"
    if isinstance(key, float):  # strconv.FormatFloat(key, 'g', -1, 32): shortest float32 digits
        import struct

        single = struct.unpack("f", struct.pack("f", key))[0]
        digits = next(f"{key:.{p}g}" for p in range(1, 10)
                      if struct.unpack("f", struct.pack("f", float(f"{key:.{p}g}")))[0] == single)
        mantissa, _, exponent = digits.partition("e")
        return mantissa + (f"e{exponent[0]}{int(exponent[1:]):02d}" if exponent else "")
    raise KubectlYamlError(f"unsupported map key {key!r} (sigs.k8s.io/yaml: JSON keys are strings)")


def _as_json(node: Any) -> Any:
    """What the API server decodes from the JSON kubectl sends for `node`."""
    if isinstance(node, dict):
        return {_json_key(k): _as_json(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_as_json(v) for v in node]
    if isinstance(node, bool) or node is None or isinstance(node, str):
        return node
    if isinstance(node, int):  # a uint64 beyond int64 arrives as a float
        return node if _INT64[0] <= node <= _INT64[1] else float(node)
    if isinstance(node, _NonFinite):
        raise KubectlYamlError(f"`{node.text}` is a float JSON cannot hold (kubectl fails: json: unsupported value)",
                               node.line)
    if isinstance(node, float):  # encoding/json writes integral values below 1e21 without a fraction
        return int(node) if node.is_integer() and abs(node) < 1e21 and _INT64[0] <= node <= _INT64[1] else node
    raise KubectlYamlError(f"a value JSON cannot hold: {node!r}")


def load_all(text: str) -> list[Any]:
    """The documents of `text` as the API server receives them from `kubectl apply` (empty documents dropped)."""
    try:
        loaded = list(yaml.load_all(text, Loader=_KubectlLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        if not isinstance(exc, yaml.constructor.ConstructorError):
            problem = f"not valid YAML: {problem}"
        raise KubectlYamlError(problem, mark.line + 1 if mark else None) from None
    return [_as_json(doc) for doc in loaded if doc is not None]


def load(text: str) -> Any:
    docs = load_all(text)
    if len(docs) != 1:
        raise KubectlYamlError(f"expected one YAML document, found {len(docs)}")
    return docs[0]


# YAML 1.1's own implicit types (yaml.org/type: int, float, bool, null), for what neither PyYAML nor go-yaml v2
# implements (sexagesimal numbers, YAML 1.1's whole boolean list), and YAML 1.2's core schema numbers (go-yaml v3,
# ruamel.yaml: `1e999`, `0o17`).
_OTHER_READERS = re.compile(r"""[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?
                       |[-+]?0b[01_]+|[-+]?0[0-7_]+|[-+]?0x[0-9a-fA-F_]+|[-+]?(0|[1-9][0-9_]*)
                       |[-+]?([0-9][0-9_]*)?\.[0-9_]*([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)
                       |y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF
                       |~|null|Null|NULL|=|<<
                       |[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|0o[0-7]+""", re.X)


def reads_as_string_everywhere(text: str) -> bool:
    """Whether `text`, written as a plain scalar, is a string to PyYAML, go-yaml v2, YAML 1.1 and 1.2 alike."""
    return (go_yaml_v2_resolve(text)[0] == STR and not _OTHER_READERS.fullmatch(text)
            and _PYYAML.resolve(yaml.ScalarNode, text, (True, False)) == STR)


_PYYAML = yaml.resolver.Resolver()  # PyYAML's YAML 1.1 implicit resolvers, as its SafeLoader uses them


class _Dumper(yaml.SafeDumper):
    """PyYAML's SafeDumper, told that a string other readers would take for another type is not plain-safe
    (the emitter then quotes it), and spelling shared values out (no &id001 anchors: people read these files)."""

    def resolve(self, kind, value, implicit):
        tag = super().resolve(kind, value, implicit)
        if kind is yaml.ScalarNode and implicit[0] and tag == STR and not reads_as_string_everywhere(value):
            return NULL  # any tag but str: the serializer finds the plain form ambiguous and quotes it
        return tag

    def ignore_aliases(self, data):
        return True


def dump_all(documents: list[Any]) -> str:
    """`---`-separated YAML documents, keys in their given order, long lines kept whole."""
    return "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=10_000)
                        for d in documents)
