"""`hpc k8s validate`: Kubernetes manifests checked offline, no cluster contacted.

Three layers, each giving findings that name the document, the key path and the fix:
  - core kinds (PersistentVolumeClaim, StorageClass, ...) against the Kubernetes OpenAPI schemas that
    `kubernetes-validate` ships (strict: unknown keys are errors);
  - PyTorchJob (kubeflow.org/v1) against a schema made from the Training Operator's own Python models
    (`kubeflow-training`), MPIJob (kubeflow.org/v2beta1) against the MPI Operator's v2beta1 API (written out
    below: no package ships it); their pod templates against the core PodTemplateSpec schema;
  - the toolkit's checks: GPUs and EFA devices against the instance type's catalog facts, nProcPerNode and
    slotsPerWorker against the GPUs, claims that are not ReadWriteMany, values left to fill in.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Iterator

from toolkit.cluster.findings import Finding, has_errors
from toolkit.errors import HpcError

KUBERNETES_VERSION = "1.33"  # the EKS standard-support release the schemas are taken from
INSTALL_FIX = "pip install 'hpc-toolkit[k8s]' (kubernetes-validate and kubeflow-training)"
DEFS = "https://kubernetes.io/api/_definitions.json#/$defs/"
QUANTITY = DEFS + "io.k8s.apimachinery.pkg.api.resource.Quantity"
KUBEFLOW = {"PyTorchJob": "kubeflow.org/v1", "MPIJob": "kubeflow.org/v2beta1"}
_LEVEL_ORDER = {"error": 0, "warning": 1, "info": 2}
# Kubernetes client model names the Kubeflow models refer to -> the OpenAPI definitions they are.
_K8S_MODELS = {
    "V1PodTemplateSpec": "io.k8s.api.core.v1.PodTemplateSpec",
    "V1ObjectMeta": "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
    "K8sIoApiAutoscalingV2MetricSpec": "io.k8s.api.autoscaling.v2.MetricSpec",
    "Quantity": "io.k8s.apimachinery.pkg.api.resource.Quantity",
}


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
def _definitions() -> dict:
    return _kubernetes_validate().schema_contents(f"{_schema_dir()}/_definitions.json", KUBERNETES_VERSION)


def _core_schema(kind: str, api_version: str) -> dict | None:
    utils = _kubernetes_validate()
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        return utils.schema_contents(f"{_schema_dir()}/{kind.lower()}-{group}.json", KUBERNETES_VERSION)
    except FileNotFoundError:
        return None


def _core_api_versions(kind: str) -> list[str]:
    """The apiVersions Kubernetes serves `kind` in (from the schemas' apiVersion enums)."""
    import json
    from importlib import resources

    folder = resources.files("kubernetes_validate").joinpath(_schema_dir())
    found = []
    for entry in folder.iterdir():
        if entry.name.startswith(kind.lower() + "-") and not entry.name[len(kind) + 1:].startswith("list"):
            schema = json.loads(entry.read_text())
            if kind in (schema.get("properties", {}).get("kind", {}).get("enum") or []):
                found += schema["properties"]["apiVersion"].get("enum") or []
    return sorted(found)


def _model_schema(type_name: str, models) -> dict:
    """A JSON schema for an OpenAPI-generated model type of kubeflow-training (strict: unknown keys fail)."""
    simple = {"str": {"type": "string"}, "int": {"type": "integer"}, "bool": {"type": "boolean"},
              "object": {}, "datetime": {"type": "string"}}
    if type_name in simple:
        return simple[type_name]
    if type_name.startswith("list["):
        return {"type": "array", "items": _model_schema(type_name[5:-1], models)}
    if type_name.startswith("dict(str, "):
        return {"type": "object", "additionalProperties": _model_schema(type_name[10:-1], models)}
    if type_name in _K8S_MODELS:
        return {"$ref": DEFS + _K8S_MODELS[type_name]}
    cls = getattr(models, type_name)
    config = _configuration()
    properties, required = {}, []
    for attr, key in cls.attribute_map.items():
        properties[key] = _model_schema(cls.openapi_types[attr], models)
        probe = cls.__new__(cls)
        probe.local_vars_configuration = config
        try:  # the model's own setter says whether the field is required
            setattr(probe, attr, None)
        except ValueError:
            required.append(key)
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


@functools.cache
def _configuration():
    from kubeflow.training.configuration import Configuration

    config = Configuration()
    config.client_side_validation = True
    return config


@functools.cache
def _kubeflow_schema(kind: str) -> dict:
    if kind == "PyTorchJob":
        try:
            from kubeflow.training import models
        except ImportError:
            raise HpcError("kubeflow-training is not installed: PyTorchJobs are checked against its models",
                           fix=INSTALL_FIX) from None
        schema = _model_schema("KubeflowOrgV1PyTorchJob", models)
        schema["properties"].pop("status", None)
        spec = schema["properties"]["spec"]["properties"]
        spec["pytorchReplicaSpecs"]["propertyNames"] = {"enum": ["Master", "Worker"]}
    else:
        schema = mpi_job_schema()
    schema["properties"]["apiVersion"] = {"const": KUBEFLOW[kind]}
    schema["properties"]["kind"] = {"const": kind}
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    return schema


def mpi_job_schema() -> dict:
    """MPIJob kubeflow.org/v2beta1, written out from the MPI Operator's v2beta1 API (kubeflow/mpi-operator,
    pkg/apis/kubeflow/v2beta1: types.go and its swagger.json); strict like the Kubeflow models' schema."""
    integer, string = {"type": "integer"}, {"type": "string"}
    replica = {"type": "object", "additionalProperties": False, "properties": {
        "replicas": integer,
        "restartPolicy": {"enum": ["Always", "OnFailure", "Never", "ExitCode"]},
        "template": {"$ref": DEFS + "io.k8s.api.core.v1.PodTemplateSpec"}}}
    run_policy = {"type": "object", "additionalProperties": False, "properties": {
        "activeDeadlineSeconds": integer, "backoffLimit": integer, "ttlSecondsAfterFinished": integer,
        "cleanPodPolicy": {"enum": ["None", "Running", "All"]}, "suspend": {"type": "boolean"},
        "managedBy": string,
        "schedulingPolicy": {"type": "object", "additionalProperties": False, "properties": {
            "minAvailable": integer, "queue": string, "priorityClass": string, "scheduleTimeoutSeconds": integer,
            "minResources": {"type": "object", "additionalProperties": {"$ref": QUANTITY}}}}}}
    spec = {"type": "object", "additionalProperties": False, "required": ["mpiReplicaSpecs"], "properties": {
        "slotsPerWorker": integer, "runLauncherAsWorker": {"type": "boolean"}, "sshAuthMountPath": string,
        "launcherCreationPolicy": {"enum": ["AtStartup", "WaitForWorkersReady"]},
        "mpiImplementation": {"enum": ["OpenMPI", "Intel", "MPICH"]}, "runPolicy": run_policy,
        "mpiReplicaSpecs": {"type": "object", "required": ["Launcher"], "additionalProperties": replica,
                            "propertyNames": {"enum": ["Launcher", "Worker"]}}}}
    return {"type": "object", "additionalProperties": False, "properties": {
        "apiVersion": string, "kind": string,
        "metadata": {"$ref": DEFS + "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}, "spec": spec}}


def _validator(schema: dict):
    import jsonschema
    from referencing import Registry, Resource

    registry = Resource.from_contents(_definitions()) @ Registry()
    return jsonschema.Draft202012Validator(schema, registry=registry)


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


def _schema_fix(error) -> str:
    if error.validator == "additionalProperties":
        return "remove the key, or fix its spelling or indentation (see the kind's API reference)"
    if error.validator in ("enum", "const"):
        allowed = error.validator_value if error.validator == "enum" else [error.validator_value]
        return f"use {' or '.join(repr(v) for v in allowed)}"
    if error.validator == "required":
        return "add the key"
    if error.validator == "propertyNames":
        return "use one of the replica types the operator knows"
    return "give a value of the type the schema expects"


def _schema_findings(doc: dict, where: str) -> list[Finding]:
    from jsonschema.exceptions import best_match

    kind, api_version = doc.get("kind"), doc.get("apiVersion")
    if not isinstance(kind, str) or not isinstance(api_version, str):
        return [Finding("error", f"{where}: {'kind' if not isinstance(kind, str) else 'apiVersion'}",
                        "every Kubernetes document needs apiVersion and kind", "add them (e.g. apiVersion: v1, "
                        "kind: PersistentVolumeClaim)", source="schema")]
    if kind in KUBEFLOW:
        if api_version != KUBEFLOW[kind]:
            return [Finding("error", f"{where}: apiVersion", f"{kind} is served as {KUBEFLOW[kind]}, not "
                            f"{api_version}", f"set apiVersion: {KUBEFLOW[kind]}", source="schema")]
        schema = _kubeflow_schema(kind)
    else:
        schema = _core_schema(kind, api_version)
        if schema is None:
            versions = _core_api_versions(kind)
            if versions:
                return [Finding("error", f"{where}: apiVersion", f"Kubernetes {KUBERNETES_VERSION} serves {kind} "
                                f"as {', '.join(versions)}, not {api_version}", f"set apiVersion: {versions[-1]}",
                                source="schema")]
            return [Finding("error", f"{where}: kind", f"{kind} ({api_version}) is neither a Kubernetes "
                            f"{KUBERNETES_VERSION} kind nor a Kubeflow kind this toolkit knows",
                            "fix the kind's spelling, or validate it with the tools of the operator that defines it",
                            source="schema")]
    findings = []
    for error in sorted(_validator(schema).iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        deepest = best_match(error.context) if error.context else error
        path = key_path(list(deepest.absolute_path))
        findings.append(Finding("error", f"{where}: {path or '(document)'}", deepest.message, _schema_fix(deepest),
                                source="schema"))
    return findings


def _pod_templates(doc: dict) -> Iterator[tuple[list, dict, int]]:
    """(key path, pod template, replicas) of a Kubeflow job's replicas."""
    spec = doc.get("spec") or {}
    replicas_key = {"PyTorchJob": "pytorchReplicaSpecs", "MPIJob": "mpiReplicaSpecs"}.get(doc.get("kind"))
    for name, replica in (spec.get(replicas_key) or {}).items() if replicas_key else ():
        if isinstance(replica, dict) and isinstance(replica.get("template"), dict):
            yield ["spec", replicas_key, name, "template"], replica["template"], int(replica.get("replicas") or 1)


def _count(value: Any) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None


def _our_findings(docs: list[tuple[str, dict]]) -> list[Finding]:
    from toolkit.catalog import catalog
    from toolkit.k8s.manifests import EFA, FILL_IN, GPU, HUGEPAGES, INSTANCE_LABEL

    findings: list[Finding] = []
    claims = {(d.get("metadata") or {}).get("name"): (where, d) for where, d in docs
              if d.get("kind") == "PersistentVolumeClaim"}
    for where, doc in docs:
        for path, value in _walk(doc, []):
            if isinstance(value, str) and value.startswith(FILL_IN):
                findings.append(Finding("warning", f"{where}: {key_path(path)}", f"still to fill in: {value}",
                                        "replace the marked value before `kubectl apply`"))
        for tpath, template, replicas in _pod_templates(doc):
            pod = template.get("spec") or {}
            itype = (pod.get("nodeSelector") or {}).get(INSTANCE_LABEL)
            it = catalog().get(itype) if itype else None
            for i, container in enumerate(pod.get("containers") or []):
                cpath = tpath + ["spec", "containers", i, "resources"]
                res = container.get("resources") or {}
                limits = {**(res.get("requests") or {}), **(res.get("limits") or {})}
                gpus, efa = _count(limits.get(GPU, 0)), _count(limits.get(EFA, 0))
                lpath = cpath + ["limits" if EFA in (res.get("limits") or {}) else "requests"]
                if (gpus or efa) and itype is None:
                    findings.append(Finding("warning", f"{where}: {key_path(tpath + ['spec', 'nodeSelector'])}",
                                            "GPUs/EFA requested, but no instance-type nodeSelector: the counts "
                                            "cannot be checked against an instance", f"add nodeSelector "
                                            f"{INSTANCE_LABEL}: <instance type>"))
                if it is not None and efa is not None and efa > it.efa_interfaces:
                    findings.append(Finding(
                        "error", f"{where}: {key_path(lpath + [EFA])}",
                        f"{efa} EFA devices requested; {it.name} has {it.efa_interfaces}: the pod never schedules",
                        f"request {it.efa_interfaces}" if it.efa_interfaces
                        else f"remove {EFA} ({it.name} has no EFA)"))
                elif it is not None and efa is not None and 0 < efa < it.efa_interfaces:
                    findings.append(Finding(
                        "warning", f"{where}: {key_path(lpath + [EFA])}",
                        f"{efa} of {it.name}'s {it.efa_interfaces} EFA devices requested: all-reduce bandwidth drops "
                        "with fewer adapters (measured on p4d: 8.24 GB/s with 4, 3.02 with 1)",
                        f"request all {it.efa_interfaces}"))
                if efa and HUGEPAGES not in limits:
                    findings.append(Finding("warning", f"{where}: {key_path(lpath)}", "EFA requested without "
                                            "huge pages: libfabric's EFA provider allocates from 2 MiB huge pages",
                                            f"request {HUGEPAGES}: 5120Mi (requests and limits)"))
                if it is not None and gpus is not None and gpus > it.gpus:
                    findings.append(Finding("error", f"{where}: {key_path(lpath + [GPU])}",
                                            f"{gpus} GPUs requested; {it.name} has {it.gpus}",
                                            f"request {it.gpus}" if it.gpus else f"remove {GPU}"))
                findings += _ranks_vs_gpus(where, doc, gpus, key_path(lpath + [GPU]))
            for v, volume in enumerate(pod.get("volumes") or []):
                name = (volume.get("persistentVolumeClaim") or {}).get("claimName")
                if name is None:
                    continue
                if name not in claims:
                    findings.append(Finding("info", f"{where}: {key_path(tpath + ['spec', 'volumes', v])}",
                                            f"claim {name} is not in this file: its access mode is not checked",
                                            f"check it is ReadWriteMany: kubectl get pvc {name} -o "
                                            "jsonpath='{.spec.accessModes}'"))
                    continue
                cwhere, claim = claims[name]
                modes = (claim.get("spec") or {}).get("accessModes") or []
                if "ReadWriteMany" not in modes and replicas > 1:
                    findings.append(Finding(
                        "error", f"{cwhere}: spec.accessModes",
                        f"claim {name} is {', '.join(modes) or 'without access modes'}, but {replicas} pods on "
                        f"different nodes mount it ({where})",
                        "use accessModes: [ReadWriteMany] (FSx for Lustre through fsx.csi.aws.com supports it)"))
    return findings


def _ranks_vs_gpus(where: str, doc: dict, gpus: int | None, gpu_path: str) -> list[Finding]:
    spec = doc.get("spec") or {}
    if not gpus:
        return []
    if doc.get("kind") == "PyTorchJob":
        deprecated = (spec.get("elasticPolicy") or {}).get("nProcPerNode")  # before Training Operator 1.7
        for path, value in ((["spec", "nprocPerNode"], spec.get("nprocPerNode")),
                            (["spec", "elasticPolicy", "nProcPerNode"], deprecated)):
            if value is not None and _count(value) is not None and _count(value) != gpus:
                return [Finding("error", f"{where}: {key_path(path)}",
                                f"{value} processes per node, but each pod gets {gpus} GPUs ({gpu_path})",
                                f"set {path[-1]}: {gpus if path[-1] == 'nProcPerNode' else repr(str(gpus))} "
                                "(one process per GPU)")]
    if doc.get("kind") == "MPIJob" and spec.get("slotsPerWorker") not in (None, gpus):
        return [Finding("error", f"{where}: spec.slotsPerWorker", f"{spec['slotsPerWorker']} slots per worker, but "
                        f"each worker gets {gpus} GPUs ({gpu_path})", f"set slotsPerWorker: {gpus} (one rank per GPU)")]
    return []


def _walk(node: Any, path: list) -> Iterator[tuple[list, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, path + [key])
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, path + [i])
    else:
        yield path, node


def _describe(index: int, doc: dict) -> str:
    name = (doc.get("metadata") or {}).get("name") if isinstance(doc.get("metadata"), dict) else None
    return f"document {index} ({doc.get('kind', '?')}{'/' + name if name else ''})"


def validate_text(text: str, file: str = "<manifests>") -> dict:
    """The findings for a multi-document manifest file: {"file", "valid", "documents", "findings"}."""
    import yaml

    try:
        loaded = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "(file)"
        findings = [Finding("error", where, f"not valid YAML: {getattr(exc, 'problem', exc)}",
                            "fix the YAML syntax", file=file, source="yaml")]
        return {"file": file, "valid": False, "documents": [], "findings": [f.as_dict() for f in findings]}
    findings: list[Finding] = []
    docs = []
    for index, doc in enumerate(loaded, 1):
        if not isinstance(doc, dict):
            findings.append(Finding("error", f"document {index}", "a Kubernetes document is a mapping",
                                    "remove the stray text between the `---` lines", source="yaml"))
            continue
        where = _describe(index, doc)
        found = _schema_findings(doc, where)
        findings += found
        docs.append((where, doc))
    if not loaded:
        findings.append(Finding("error", "(file)", "no Kubernetes documents in the file",
                                "render some: hpc k8s render RECIPE --nodes N --instance TYPE -o FILE"))
    findings += _our_findings(docs)
    findings = sorted((Finding(**{**f.as_dict(), "file": file}) for f in findings),
                      key=lambda f: _LEVEL_ORDER[f.level])
    return {"file": file, "valid": not has_errors(findings), "documents": [w for w, _ in docs],
            "findings": [f.as_dict() for f in findings]}


def validate_file(path: str | Path) -> dict:
    from toolkit.textfile import read_text

    text = read_text(path, "manifest", fix="pass a manifest file (hpc k8s render ... -o FILE)")
    return validate_text(text, str(path))
