"""The Kubernetes core API's OpenAPI schemas (kubernetes-validate's strict JSON schemas), offline.

"Strict": the schemas forbid keys the API does not define, as the API server rejects them under kubectl's
`--validate=strict` (the default since kubectl 1.27).
"""

from __future__ import annotations

import functools
import re

from toolkit.errors import HpcError

KUBERNETES_VERSION = "1.33"  # the EKS standard-support release the schemas are taken from
INSTALL_FIX = "pip install 'hpc-toolkit[k8s]' (kubernetes-validate)"
DEFS = "https://kubernetes.io/api/_definitions.json#/$defs/"


def _kubernetes_validate():
    try:
        from kubernetes_validate import utils
    except ImportError:
        raise HpcError("kubernetes-validate is not installed: `hpc k8s validate` checks manifests against its "
                       "Kubernetes schemas", fix=INSTALL_FIX) from None
    return utils


def _schema_dir() -> str:
    utils = _kubernetes_validate()
    version = [v for v in utils.all_versions() if utils.major_minor(v) == KUBERNETES_VERSION][-1]
    return f"kubernetes-json-schema/v{version}-local-strict"


@functools.cache
def definitions() -> dict:
    return _kubernetes_validate().schema_contents(f"{_schema_dir()}/_definitions.json", KUBERNETES_VERSION)


def kind_schema(kind: str, api_version: str) -> dict | None:
    """The schema of a core kind in one apiVersion (None: Kubernetes does not serve it so)."""
    utils = _kubernetes_validate()
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        return utils.schema_contents(f"{_schema_dir()}/{kind.lower()}-{group}.json", KUBERNETES_VERSION)
    except FileNotFoundError:
        return None


def api_versions(kind: str) -> list[str]:
    """The apiVersions Kubernetes serves `kind` in (from the schemas' apiVersion enums)."""
    import json
    from importlib import resources

    folder = resources.files("kubernetes_validate").joinpath(_schema_dir())
    found: list[str] = []
    for entry in folder.iterdir():
        if entry.name.startswith(kind.lower() + "-") and not entry.name[len(kind) + 1:].startswith("list"):
            schema = json.loads(entry.read_text())
            if kind in (schema.get("properties", {}).get("kind", {}).get("enum") or []):
                found += schema["properties"]["apiVersion"].get("enum") or []
    return sorted(found)


@functools.cache
def _registry():
    from referencing import Registry, Resource

    return Resource.from_contents(definitions()) @ Registry()


def validator(schema: dict):
    """A jsonschema validator for `schema`, whose $refs reach the core definitions."""
    import jsonschema

    return jsonschema.Draft202012Validator(schema, registry=_registry())


def definition_validator(name: str):
    """A validator for one core definition, e.g. io.k8s.api.core.v1.PodTemplateSpec."""
    return validator({"$ref": DEFS + name})


def schema_violations(schema_validator, instance, parts: tuple = ()) -> list:
    """jsonschema's errors as Violations: the field's path, worded as for a CRD."""
    from jsonschema.exceptions import best_match

    from toolkit.k8s.violations import TYPE_PHRASE, UNKNOWN_FIELD, UNKNOWN_FIELD_FIX, Violation, type_violation

    found = []
    for error in schema_validator.iter_errors(instance):
        error = best_match(error.context) if error.context else error
        where = parts + tuple(error.absolute_path)
        if error.validator == "additionalProperties":
            known = error.schema.get("properties", {})
            found += [Violation(where + (key,), UNKNOWN_FIELD, fix=UNKNOWN_FIELD_FIX)
                      for key in error.instance if key not in known]
        elif error.validator == "type":
            wanted = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
            kind = next(t for t in wanted if t != "null")
            found.append(type_violation(where, TYPE_PHRASE.get(kind, kind), error.instance))
        elif error.validator == "required":
            found += [Violation(where + (key,), "required", fix="add the key")
                      for key in error.validator_value if key not in error.instance]
        elif error.validator == "enum":
            found.append(Violation(where, f"must be one of {', '.join(map(repr, error.validator_value))}, not "
                                          f"{error.instance!r}"))
        else:
            found.append(Violation(where, error.message))
    return sorted(found, key=lambda v: [str(p) for p in v.parts])


def definition_violations(name: str, instance, parts: tuple = ()) -> list:
    """`instance` checked against one core definition (strict)."""
    return schema_violations(definition_validator(name), instance, parts)
