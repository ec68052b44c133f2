"""A researcher's own script or module on Kubernetes (`hpc k8s render SCRIPT.py|--module MODULE -- ARGS`): the
recipe `hpc run` builds for it (toolkit.recipes.user), and where the pods read the script.

The pods see the image and the FSx volume, not the file system the script is on here. A script comes
  - from the image (the default when --image is given; --script-from image): the image holds it at the path
    given (a relative path: under the image's working directory, where the container starts); or
  - from a ConfigMap (the default without --image; --script-from configmap): the file's bytes, mounted read-only
    at CODE_DIR in every pod. One file: modules beside it are not carried (those go in the image). The API
    server refuses a ConfigMap whose data exceeds 1 MiB (kubernetes/kubernetes pkg/apis/core/validation/
    validation.go ValidateConfigMap: data + binaryData > core.MaxSecretSize), so a bigger file is refused here.
A module is imported by the pods: it comes from the image, so --module needs --image.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
from typing import Any, Sequence

from toolkit.errors import UsageError

IMAGE, CONFIGMAP = "image", "configmap"
SOURCES = (IMAGE, CONFIGMAP)  # --script-from
CODE_DIR = "/opt/hpc/code"  # where a ConfigMap's script is mounted in the pods
CODE_VOLUME = "code"
# kubernetes/kubernetes pkg/apis/core/types.go MaxSecretSize, the limit ValidateConfigMap applies to a ConfigMap's
# data and binaryData together (their decoded bytes)
CONFIGMAP_MAX_BYTES = 1024 * 1024
# kubernetes/apimachinery pkg/api/validation/objectmeta.go TotalAnnotationSizeLimitB: all annotations of an object.
# Client-side `kubectl apply` (what `hpc k8s apply` runs) keeps the object's JSON in one of them.
ANNOTATIONS_MAX_BYTES = 256 * 1024
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
_CONFIGMAP_KEY = re.compile(r"[-._a-zA-Z0-9]+")  # k8s.io/apimachinery validation IsConfigMapKey


def is_user_code(name: str | None, module: str | None) -> bool:
    """`hpc k8s render`'s argument is a researcher's own code (--module, or a .py file), not a recipe: a recipe is
    a name ([a-z0-9_-], no dot) or a YAML file."""
    return module is not None or (name or "").endswith(".py")


def user_code_recipe(name: str | None, module: str | None, script_args: Sequence[str], nodes: int,
                     image: str | None) -> dict[str, Any]:
    """The recipe (as data) `hpc run` builds for SCRIPT.py or --module MODULE and its arguments, on `nodes` nodes.
    Style script: on Kubernetes each pod's torchrun is its node's agent (toolkit.k8s.manifests)."""
    from toolkit.recipes.user import user_recipe

    if module is not None:
        if image is None:
            raise UsageError(f"--module {module}: the pods import the module from the image, and no --image is given",
                             fix="give --image IMAGE, an image that holds the module (installed, or on its "
                                 "PYTHONPATH); or render a single-file script instead (SCRIPT.py, which a ConfigMap "
                                 "carries)")
        # with --module there is no recipe or script argument: every word is the module's
        return user_recipe(module, [*([name] if name is not None else []), *script_args], nodes=nodes, module=True)
    assert name is not None
    if not os.path.isfile(name):
        raise UsageError(f"script {name} does not exist here",
                         fix="give the path of your script on this machine: the render reads it (a ConfigMap "
                             "carries it, or with --image the image must hold it at that path)")
    return user_recipe(name, script_args, nodes=nodes)


@dataclasses.dataclass(frozen=True)
class PlacedScript:
    """Where the pods read a script: `path` in their containers; a ConfigMap (document, volume, mount) or none."""

    source: str  # IMAGE or CONFIGMAP
    path: str
    note: str
    configmap: dict | None = None
    volume: dict | None = None
    mount: dict | None = None


def place_script(local: str, source: str | None, image: str | None, in_image: str, name: str, namespace: str,
                 labels: dict) -> PlacedScript:
    """Where the pods of job `name` read the script that is at `local` here: the image (at `in_image`) or a
    ConfigMap of its bytes. `source` as --script-from (None: the image if one is given, else a ConfigMap)."""
    if source is not None and source not in SOURCES:
        raise UsageError(f"--script-from {source!r} is not one of {', '.join(SOURCES)}", fix="use one of them")
    source = source or (IMAGE if image else CONFIGMAP)
    if source == IMAGE:
        if image is None:
            raise UsageError("--script-from image: no --image is given", fix="give --image IMAGE (an image that holds "
                             "the script), or leave out --script-from (a ConfigMap carries the script)")
        where = in_image if in_image.startswith("/") else f"{in_image} under its working directory"
        return PlacedScript(IMAGE, in_image, f"the script comes from the image (--image given): {image} must hold it "
                            f"at {where}; --script-from configmap carries this file in a ConfigMap instead")
    with open(local, "rb") as file:
        data = file.read()
    if len(data) > CONFIGMAP_MAX_BYTES:
        raise UsageError(f"script {local} is {len(data)} bytes: a ConfigMap carries at most {CONFIGMAP_MAX_BYTES} "
                         "bytes (1 MiB; the API server refuses a bigger one)",
                         fix="bake the script into an image and give --image IMAGE (the image must hold it at that "
                             "path)")
    key = os.path.basename(local)
    key = key if _CONFIGMAP_KEY.fullmatch(key) else re.sub(r"[^-._a-zA-Z0-9]", "_", key)
    try:
        payload: dict[str, Any] = {"data": {key: data.decode("utf-8")}}
    except UnicodeDecodeError:  # `data` holds UTF-8 text only
        payload = {"binaryData": {key: base64.b64encode(data).decode("ascii")}}
    configmap_name = f"{name}-code"
    configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": configmap_name, "namespace": namespace, "labels": labels}, **payload}
    why = "no --image given" if image is None else "--script-from configmap"
    note = (f"the script comes from ConfigMap {configmap_name} ({why}): the {len(data)} bytes of {local}, mounted "
            f"read-only at {CODE_DIR}/{key} in every pod; one file only (modules beside it are not carried: bake "
            "them into an image and give --image)")
    applied = last_applied_bytes(configmap)
    if applied > ANNOTATIONS_MAX_BYTES:
        note += (f". Client-side `kubectl apply` (and `hpc k8s apply`) would keep a {applied}-byte copy of the "
                 f"ConfigMap in its {LAST_APPLIED} annotation, over the API server's {ANNOTATIONS_MAX_BYTES}-byte "
                 "limit for annotations: create it with `kubectl apply --server-side -f FILE`")
    return PlacedScript(CONFIGMAP, f"{CODE_DIR}/{key}", note, configmap,
                        {"name": CODE_VOLUME, "configMap": {"name": configmap_name}},
                        {"name": CODE_VOLUME, "mountPath": CODE_DIR, "readOnly": True})


def data_bytes(configmap: dict) -> int:
    """What ValidateConfigMap counts: the bytes of data's values and binaryData's decoded values."""
    text = sum(len(str(v).encode("utf-8")) for v in (configmap.get("data") or {}).values())
    binary = 0
    for value in (configmap.get("binaryData") or {}).values():
        try:
            binary += len(base64.b64decode(str(value), validate=True))
        except ValueError:
            binary += len(str(value))  # not base64: the schema check says so; counted as written
    return text + binary


def last_applied_bytes(doc: dict) -> int:
    """About the size client-side `kubectl apply` gives the object's last-applied-configuration annotation (its
    key and the object's JSON as Go's encoding/json writes it, which escapes <, > and & as \\u003c...)."""
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    return len(LAST_APPLIED) + len(text.encode("utf-8")) + 5 * sum(text.count(c) for c in "<>&") + 1
