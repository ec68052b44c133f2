"""Custom resources checked as the API server checks them against a CustomResourceDefinition, offline.

The CRDs are the operators' own published files, vendored unchanged in crds/ (sources, commits and how to refresh
them: crds/SOURCES.md). A CR is validated against its version's `openAPIV3Schema` with the API server's
structural-schema semantics (kubernetes/kubernetes staging/src/k8s.io/apiextensions-apiserver; the rules are
described in "Extend the Kubernetes API with CustomResourceDefinitions", kubernetes.io):

  - pruning: a field the schema does not specify is dropped, and is an error under field validation Strict
    (kubectl's `--validate=strict`, its default): "unknown field". x-kubernetes-preserve-unknown-fields keeps an
    object's unspecified fields; x-kubernetes-embedded-resource allows apiVersion, kind and metadata;
  - a null where the schema is not `nullable` is pruned (as if absent), before `required` is checked;
  - defaults are applied before validation (a defaulted field satisfies `required`);
  - x-kubernetes-int-or-string: an integer or a string; formats int32/int64 bound integers; date-time;
  - x-kubernetes-list-type set / map (+ x-kubernetes-list-map-keys): no duplicate items / keys;
  - the value validations (enum, pattern, min/max, lengths, items, properties, anyOf/allOf/oneOf/not);
  - x-kubernetes-validations (CEL) are not evaluated here: a rule that compares with `oldSelf` applies to updates
    only; any other is reported as a note, unevaluated;
  - metadata at the root and in embedded resources: the core ObjectMeta (strict), and a name that is a DNS
    subdomain, as for every custom resource.

Use: `validate_against_crd(obj)` finds the CRD by the object's apiVersion and kind (or pass a Crd, a CRD's name
or a CRD file); `find_crd`, `crd_named`, `load_crd`, `vendored_crds`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from pathlib import Path
from typing import Any, Iterator

from toolkit.k8s.violations import (TYPE_PHRASE, UNKNOWN_FIELD, UNKNOWN_FIELD_FIX, Violation, type_name,
                                    type_violation)

CRD_DIR = Path(__file__).with_name("crds")
# looked up with whatever `format` a schema holds (a string, or nothing)
_INT_RANGES: dict[object, tuple[float, float]] = {"int32": (-(1 << 31), (1 << 31) - 1),
                                                  "int64": (-(1 << 63), (1 << 63) - 1)}
_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[-+]\d{2}:\d{2})")
# k8s.io/apimachinery pkg/util/validation: IsDNS1123Label, IsDNS1123Subdomain, IsQualifiedName,
# IsValidLabelValue
DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN = re.compile(rf"{DNS1123_LABEL}(\.{DNS1123_LABEL})*")
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # k8s.io/apimachinery pkg/util/validation
_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


@dataclasses.dataclass(frozen=True)
class Crd:
    """A CustomResourceDefinition: its group, kind and the schema of each served version."""

    group: str
    kind: str
    schemas: dict  # version -> openAPIV3Schema
    source: str  # where it was read from
    name: str = ""  # metadata.name: PLURAL.GROUP, e.g. pytorchjobs.kubeflow.org

    @property
    def api_versions(self) -> list[str]:
        return [f"{self.group}/{v}" for v in self.schemas]


def load_crd(path: str | Path) -> Crd:
    """A CRD file (apiextensions.k8s.io/v1), read as kubectl reads it."""
    from toolkit.k8s.kubeyaml import load

    doc = load(Path(path).read_text())
    if doc.get("kind") != "CustomResourceDefinition":
        raise ValueError(f"{path} is not a CustomResourceDefinition")
    spec = doc["spec"]
    schemas = {v["name"]: v["schema"]["openAPIV3Schema"] for v in spec["versions"] if v.get("served", True)}
    return Crd(spec["group"], spec["names"]["kind"], schemas, str(path), doc["metadata"]["name"])


@functools.cache
def vendored_crds() -> dict[tuple[str, str], Crd]:
    """Every CRD in crds/, by (group, kind)."""
    found = (load_crd(path) for path in sorted(CRD_DIR.glob("*.yaml")))
    return {(crd.group, crd.kind): crd for crd in found}


def find_crd(api_version: str, kind: str) -> Crd | None:
    """The vendored CRD of `kind` in the API group of `api_version` (any version: check `api_versions`)."""
    group = api_version.rpartition("/")[0]
    return vendored_crds().get((group, kind))


def crd_named(name: str) -> Crd:
    """A vendored CRD by its name (pytorchjobs.kubeflow.org), or a CRD file by its path."""
    if Path(name).is_file():
        return load_crd(name)
    found = [crd for crd in vendored_crds().values() if crd.name == name]
    if not found:
        raise KeyError(f"no CRD named {name} in {CRD_DIR} (vendored: "
                       f"{', '.join(sorted(c.name for c in vendored_crds().values()))})")
    return found[0]


def validate_against_crd(obj: dict, crd: Crd | str | None = None) -> list[Violation]:
    """What the API server says about creating `obj` (a custom resource as JSON values: kubeyaml.load_all)
    under `crd` (a Crd, a CRD's name or file; default: the vendored CRD of the object's group and kind)."""
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return [Violation(("apiVersion" if not isinstance(api_version, str) else "kind",), "required: every "
                          "Kubernetes object names its apiVersion and kind")]
    crd = crd_named(crd) if isinstance(crd, str) else crd or find_crd(api_version, kind)
    if crd is None or crd.kind != kind:
        return [Violation(("kind",), f"no vendored CRD defines {kind} in {api_version.rpartition('/')[0] or 'core'}")]
    group, _, version = api_version.rpartition("/")
    if group != crd.group or version not in crd.schemas:
        return [Violation(("apiVersion",), f"{crd.kind} is served as {' or '.join(crd.api_versions)}, not "
                          f"{api_version}")]
    found = list(_check(obj, crd.schemas[version], (), embedded=True))
    return sorted(found, key=lambda v: (v.level != "error", [str(p) for p in v.parts]))


def _type_ok(value: Any, schema: dict) -> str | None:
    """None, or what the value must be."""
    if schema.get("x-kubernetes-int-or-string"):
        return None if type_name(value) in ("integer", "string") else "an integer or a string"
    want = schema.get("type")
    if want is None:
        return None
    have = type_name(value)
    if have == want or (want == "number" and have == "integer"):
        return None
    return TYPE_PHRASE.get(want, want)


def _check(value: Any, schema: dict, parts: tuple, *, embedded: bool = False,
           structural: bool = True) -> Iterator[Violation]:
    """The violations of `value` under `schema`; `structural` False checks values only (anyOf branches...)."""
    embedded = embedded or bool(schema.get("x-kubernetes-embedded-resource"))
    if value is None:
        if not schema.get("nullable") and structural and _type_ok(value, schema):
            yield Violation(parts, f"must be {_type_ok(value, schema)}, not null")
        return
    wanted = _type_ok(value, schema)
    if wanted:
        yield type_violation(parts, wanted, value)
        return
    yield from _value_rules(value, schema, parts)
    for keyword in ("allOf", "anyOf", "oneOf"):
        branches = schema.get(keyword) or []
        if not branches:
            continue
        passed = [not list(_check(value, b, parts, structural=False)) for b in branches]
        if keyword == "allOf" and not all(passed):
            yield from (v for b in branches for v in _check(value, b, parts, structural=False))
        elif keyword == "anyOf" and not any(passed):
            yield Violation(parts, f"matches none of the allowed forms: {_forms(branches, value, parts)}")
        elif keyword == "oneOf" and sum(passed) != 1:
            yield Violation(parts, f"must match exactly one of: {_forms(branches, value, parts)}")
    if "not" in schema and not list(_check(value, schema["not"], parts, structural=False)):
        yield Violation(parts, "matches a form the schema forbids")
    for rule in schema.get("x-kubernetes-validations") or []:
        if "oldSelf" not in rule.get("rule", ""):  # transition rules apply to updates only
            yield Violation(parts, f"not checked offline: CEL rule `{rule.get('rule')}`"
                            + (f" ({rule['message']})" if rule.get("message") else ""), level="info",
                            rule=rule.get("rule"))
    if isinstance(value, dict):
        yield from _check_object(value, schema, parts, embedded=embedded, structural=structural)
    elif isinstance(value, list):
        yield from _check_list(value, schema, parts, structural=structural)


def _forms(branches: list[dict], value: Any, parts: tuple) -> str:
    return "; ".join(next((v.message for v in _check(value, b, parts, structural=False)), "ok") for b in branches)


@functools.lru_cache(maxsize=None)
def _pattern(pattern: str) -> re.Pattern | None:
    try:
        return re.compile(pattern)
    except re.error:  # RE2 syntax Python lacks: not checked here rather than misjudged
        return None


def _matches(pattern: str, value: str) -> bool:
    compiled = _pattern(pattern)
    return compiled is None or compiled.search(value) is not None  # unanchored, as the API server's


def _value_rules(value: Any, schema: dict, parts: tuple) -> Iterator[Violation]:
    if "enum" in schema and not any(type_name(value) == type_name(e) and value == e for e in schema["enum"]):
        yield Violation(parts, f"must be one of {', '.join(map(repr, schema['enum']))}, not {value!r}")
    if isinstance(value, str):
        if "pattern" in schema and not _matches(schema["pattern"], value):
            yield Violation(parts, f"{value!r} does not match the pattern {schema['pattern']}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            yield Violation(parts, f"must be at most {schema['maxLength']} characters long")
        if "minLength" in schema and len(value) < schema["minLength"]:
            yield Violation(parts, f"must be at least {schema['minLength']} characters long")
        if schema.get("format") == "date-time" and not _DATE_TIME.fullmatch(value):
            yield Violation(parts, f"{value!r} is not an RFC 3339 date-time")
    if type_name(value) in ("integer", "number"):
        low, high = _INT_RANGES.get(schema.get("format"), (-math.inf, math.inf))
        if not low <= value <= high:
            yield Violation(parts, f"{value} is out of range for {schema['format']}")
        if "minimum" in schema and (value <= schema["minimum"] if schema.get("exclusiveMinimum")
                                    else value < schema["minimum"]):
            yield Violation(parts, f"must be {'greater than' if schema.get('exclusiveMinimum') else 'at least'} "
                            f"{schema['minimum']}")
        if "maximum" in schema and (value >= schema["maximum"] if schema.get("exclusiveMaximum")
                                    else value > schema["maximum"]):
            yield Violation(parts, f"must be {'less than' if schema.get('exclusiveMaximum') else 'at most'} "
                            f"{schema['maximum']}")
        if "multipleOf" in schema and value % schema["multipleOf"]:
            yield Violation(parts, f"must be a multiple of {schema['multipleOf']}")
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            yield Violation(parts, f"must have at most {schema['maxItems']} items")
        if "minItems" in schema and len(value) < schema["minItems"]:
            yield Violation(parts, f"must have at least {schema['minItems']} items")
    if isinstance(value, dict):
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            yield Violation(parts, f"must have at most {schema['maxProperties']} keys")
        if "minProperties" in schema and len(value) < schema["minProperties"]:
            yield Violation(parts, f"must have at least {schema['minProperties']} keys")


def _check_object(value: dict, schema: dict, parts: tuple, *, embedded: bool,
                  structural: bool) -> Iterator[Violation]:
    properties = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    # pruned nulls count as absent; defaults fill what is absent
    present = {k: v for k, v in value.items() if v is not None or _nullable(k, properties, extra)}
    defaulted = {k: p["default"] for k, p in properties.items() if "default" in p and k not in present}
    for key in schema.get("required") or []:
        if key not in present and key not in defaulted:
            yield Violation(parts + (key,), "required", fix="add the key")
    for key, item in present.items():
        if embedded and (key == "metadata" or key in ("apiVersion", "kind") and key not in properties):
            continue  # checked below, as the API server checks an object's type and metadata
        if key in properties:
            yield from _check(item, properties[key], parts + (key,), structural=structural)
        elif isinstance(extra, dict):
            yield from _check(item, extra, parts + (key,), structural=structural)
        elif structural and not extra and not schema.get("x-kubernetes-preserve-unknown-fields"):
            yield Violation(parts + (key,), UNKNOWN_FIELD, fix=UNKNOWN_FIELD_FIX)
    if embedded and structural:
        for key in ("apiVersion", "kind"):
            if not isinstance(present.get(key), str) or not present[key]:
                yield Violation(parts + (key,), "required: an embedded resource names its apiVersion and kind")
        yield from _metadata(present.get("metadata"), parts + ("metadata",), root=not parts)


def _nullable(key: str, properties: dict, extra: Any) -> bool:
    schema = properties.get(key, extra if isinstance(extra, dict) else {})
    return bool(schema.get("nullable"))


def _check_list(value: list, schema: dict, parts: tuple, *, structural: bool) -> Iterator[Violation]:
    items = schema.get("items")
    if isinstance(items, dict):
        for i, item in enumerate(value):
            yield from _check(item, items, parts + (i,), structural=structural)
    list_type = schema.get("x-kubernetes-list-type")
    if list_type == "set" or schema.get("uniqueItems"):
        seen: list = []
        for i, item in enumerate(value):
            if item in seen:
                yield Violation(parts + (i,), f"duplicate value {item!r}")
            seen.append(item)
    elif list_type == "map":
        keys = schema.get("x-kubernetes-list-map-keys") or []
        seen_keys: list = []
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                continue
            identity = tuple(item.get(k, (items or {}).get("properties", {}).get(k, {}).get("default"))
                             for k in keys)
            if identity in seen_keys:
                shown = ", ".join(f"{k}={v!r}" for k, v in zip(keys, identity, strict=True))
                yield Violation(parts + (i,), f"duplicate entry ({shown}): the list is a map keyed by "
                                f"{', '.join(keys)}")
            seen_keys.append(identity)


def _qualified_name(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    return (len(name) <= 63 and bool(_NAME_PART.fullmatch(name))
            and (not slash or len(prefix) <= 253 and bool(DNS1123_SUBDOMAIN.fullmatch(prefix))))


def dns1123_label(name: str) -> bool:
    """An RFC 1123 label as Kubernetes checks one (IsDNS1123Label): namespaces' names."""
    return len(name) <= 63 and bool(re.fullmatch(DNS1123_LABEL, name))


def dns1123_subdomain(name: str) -> bool:
    """An RFC 1123 subdomain as Kubernetes checks one (IsDNS1123Subdomain): claims' and StorageClasses' names."""
    return len(name) <= 253 and bool(DNS1123_SUBDOMAIN.fullmatch(name))


def dns1035_label(name: str) -> bool:
    """An RFC 1035 label as Kubernetes checks one (IsDNS1035Label): Services' and TrainJobs' names."""
    return len(name) <= 63 and bool(_DNS1035_LABEL.fullmatch(name))


def label_violations(meta: dict, parts: tuple) -> Iterator[Violation]:
    """ObjectMeta's labels, annotation keys and namespace as the API server checks them (ValidateObjectMeta)."""
    # labels/annotations of another type are the ObjectMeta schema's error (reported before this): nothing to read
    labels, annotations = (value if isinstance(value, dict) else {} for value in (meta.get("labels"),
                                                                              meta.get("annotations")))
    for key, value in labels.items():
        if not _qualified_name(str(key)):
            yield Violation(parts + ("labels", key), "not a valid label key (an optional DNS-subdomain prefix and "
                            "'/', then at most 63 letters, digits, '-', '_' or '.', starting and ending "
                            "alphanumeric)")
        elif isinstance(value, str) and value and (len(value) > 63 or not _NAME_PART.fullmatch(value)):
            yield Violation(parts + ("labels", key), f"{value!r} is not a valid label value (at most 63 letters, "
                            "digits, '-', '_' or '.', starting and ending alphanumeric)")
    for key in annotations:
        if not _qualified_name(str(key).lower()):
            yield Violation(parts + ("annotations", key), "not a valid annotation key (a qualified name, as for "
                            "labels)")
    namespace = meta.get("namespace")
    if isinstance(namespace, str) and namespace and not dns1123_label(namespace):
        yield Violation(parts + ("namespace",), f"{namespace!r} is not a DNS-1123 label")


def _metadata(meta: Any, parts: tuple, *, root: bool) -> Iterator[Violation]:
    """ObjectMeta as the API server checks it for custom resources (and embedded resources)."""
    if meta is None:
        if root:
            yield Violation(parts + ("name",), "required: a name (or generateName)")
        return
    from toolkit.k8s.coreschema import definition_violations

    yield from definition_violations("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", meta, parts)
    if not isinstance(meta, dict):
        return
    yield from label_violations(meta, parts)
    name = meta.get("name")
    if not root:
        return
    if not name and not meta.get("generateName"):
        yield Violation(parts + ("name",), "required: a name (or generateName)")
    elif isinstance(name, str) and name and (len(name) > 253 or not DNS1123_SUBDOMAIN.fullmatch(name)):
        yield Violation(parts + ("name",), f"{name!r} is not a DNS subdomain (lower-case letters, digits, '-' "
                        "and '.', starting and ending with a letter or digit, at most 253 characters)")
