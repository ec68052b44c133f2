"""What is rejected after the schema has passed: the core API's pod validation, and the operators' own rules.

A PyTorchJob or MPIJob passes the API server with any pod template its CRD's schema admits; the pods are
validated when the operator creates them, and a rejected pod leaves the job waiting with an event, not an error
at `kubectl apply`. So the pod templates are checked here as the API server checks a pod, and each job as its
operator checks it:

  - kubernetes/kubernetes pkg/apis/core/validation/validation.go: ValidateResourceRequirements (extended resources
    and huge pages are not overcommitted: requests == limits; extended resources are whole numbers; huge pages a
    multiple of their page size and only with cpu or memory), ValidateResourceQuantityValue, container and volume
    names (DNS-1123 labels, unique), volume mounts naming a volume, environment variable names, the template's
    labels (k8s.io/apimachinery ValidateObjectMeta);
    pkg/apis/core/helper (IsNativeResource, IsHugePageResourceName, IsOvercommitAllowed, IsExtendedResourceName);
  - kubeflow/trainer v1.9.4 pkg/webhooks/pytorch/pytorchjob_webhook.go (validatePyTorchJob) and
    pkg/common/util/webhooks.go (ValidateRunPolicy): the PyTorchJob admission webhook;
  - kubeflow/mpi-operator v0.8.0 pkg/apis/kubeflow/validation/validation.go (ValidateMPIJob), after its defaults
    (pkg/apis/kubeflow/v2beta1/default.go): the controller records an invalid MPIJob's errors as an event and
    never starts it (pkg/controller/mpi_job_controller.go); and the launcherCreationPolicy values of types.go.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any, Iterator

from toolkit.k8s.crd import DNS1123_LABEL, dns1035_label, label_violations
from toolkit.k8s.violations import Violation

_DNS1123_LABEL = re.compile(DNS1123_LABEL)
_ENV_VAR_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")  # IsEnvVarName
# k8s.io/apimachinery pkg/api/resource: quantity suffixes
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: dict[str, Fraction | int] = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
                                       "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
                                       "E": 10**18}
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?")


def quantity(value: Any) -> Fraction | None:
    """A resource quantity's exact value (None: not a quantity)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return Fraction(value)
    match = _QUANTITY.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        return None
    number, suffix = Fraction(match[1]), match[2] or ""
    if suffix[:1] in ("e", "E"):
        return number * Fraction(10) ** int(suffix[1:])
    return number * (_BINARY.get(suffix) or _DECIMAL[suffix])


def _is_native(name: str) -> bool:
    return "/" not in name or "kubernetes.io/" in name


def _is_hugepages(name: str) -> bool:
    return name.startswith("hugepages-")


def _overcommit_allowed(name: str) -> bool:
    return _is_native(name) and not _is_hugepages(name)


def resource_violations(resources: dict, parts: tuple) -> Iterator[Violation]:
    """ValidateResourceRequirements for one container's `resources`."""
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    for kind, entries in (("limits", limits), ("requests", requests)):
        for name, raw in entries.items():
            where = parts + (kind, name)
            value = quantity(raw)
            if value is None:
                yield Violation(where, f"{raw!r} is not a quantity")
                continue
            if value < 0:
                yield Violation(where, "must be greater than or equal to 0")
            if not _is_native(name) and not name.startswith("requests.") and value.denominator != 1:
                yield Violation(where, f"{raw} must be an integer (an extended resource is counted in whole "
                                       "devices)")
            if _is_hugepages(name):
                page = quantity(name[len("hugepages-"):])
                if not page or value % page:
                    yield Violation(where, f"{raw} is not positive integer multiple of {name}")
            if kind == "requests":
                limit = quantity(limits[name]) if name in limits else None
                if name in limits and limit is not None and value != limit and not _overcommit_allowed(name):
                    yield Violation(where, f"must be equal to {name} limit ({limits[name]}): "
                                           f"{'huge pages' if _is_hugepages(name) else 'extended resources'} are "
                                           "not overcommitted")
                elif limit is not None and value > limit:
                    yield Violation(where, f"must be less than or equal to {name} limit ({limits[name]})")
                elif name not in limits and not _overcommit_allowed(name):
                    yield Violation(parts + ("limits", name), "Limit must be set for non overcommitable resources")
    names = set(limits) | set(requests)
    if any(map(_is_hugepages, names)) and not names & {"cpu", "memory"}:
        yield Violation(parts, "HugePages require cpu or memory")


def pod_violations(pod: dict, parts: tuple) -> Iterator[Violation]:
    """The core API's validation of a pod spec that its schema does not express (names, resources)."""
    volumes = [v.get("name") for v in pod.get("volumes") or [] if isinstance(v, dict)]
    yield from _names(volumes, parts + ("volumes",), "volume")
    containers = [c for c in pod.get("containers") or [] if isinstance(c, dict)]
    yield from _names([c.get("name") for c in containers], parts + ("containers",), "container")
    for i, container in enumerate(containers):
        cparts = parts + ("containers", i)
        if not container.get("image"):
            yield Violation(cparts + ("image",), "required")
        yield from resource_violations(container.get("resources") or {}, cparts + ("resources",))
        for m, mount in enumerate(container.get("volumeMounts") or []):
            if isinstance(mount, dict) and mount.get("name") not in volumes:
                yield Violation(cparts + ("volumeMounts", m, "name"), f"not found: no volume named "
                                f"{mount.get('name')!r} in the pod")
        for e, env in enumerate(container.get("env") or []):
            if isinstance(env, dict) and isinstance(env.get("name"), str) and not _ENV_VAR_NAME.fullmatch(env["name"]):
                yield Violation(cparts + ("env", e, "name"), f"{env['name']!r} is not a valid environment variable "
                                "name (letters, digits, '_', '-', '.'; not starting with a digit)")


def _names(names: list, parts: tuple, what: str) -> Iterator[Violation]:
    seen = set()
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            yield Violation(parts + (i, "name"), "required")
        elif len(name) > 63 or not _DNS1123_LABEL.fullmatch(name):
            yield Violation(parts + (i, "name"), f"{name!r} is not a valid {what} name (a DNS-1123 label: lower-case "
                            "letters, digits and '-', starting and ending with a letter or digit, at most 63)")
        elif name in seen:
            yield Violation(parts + (i, "name"), f"duplicate {what} name {name!r}")
        seen.add(name)


def replica_templates(obj: dict) -> Iterator[tuple[tuple, str, dict]]:
    """(path of the replica spec, replica type, replica spec) of a PyTorchJob's or MPIJob's replicas."""
    key = {"PyTorchJob": "pytorchReplicaSpecs", "MPIJob": "mpiReplicaSpecs"}.get(obj.get("kind", ""))
    spec = found if isinstance(found := obj.get("spec"), dict) else {}
    replicas = spec.get(key) if key else None
    for name, replica in (replicas or {}).items() if isinstance(replicas, dict) else ():
        if isinstance(replica, dict):
            yield ("spec", key, name), name, replica


def operator_violations(obj: dict) -> list[Violation]:
    """What the PyTorchJob webhook or the MPI Operator rejects (schema-valid objects assumed)."""
    from toolkit.k8s.trainer_v2 import admission_violations as _train_job

    check = {"PyTorchJob": _pytorch_job, "MPIJob": _mpi_job, "TrainJob": _train_job}.get(obj.get("kind", ""))
    found = list(check(obj)) if check else []
    for parts, _, replica in replica_templates(obj):
        template = replica.get("template") or {}
        found += label_violations(template.get("metadata") or {}, parts + ("template", "metadata"))
        if isinstance(template.get("spec"), dict):
            found += pod_violations(template["spec"], parts + ("template", "spec"))
    return found


def _pytorch_job(obj: dict) -> Iterator[Violation]:
    name = (obj.get("metadata") or {}).get("name") or ""
    if not dns1035_label(name):
        yield Violation(("metadata", "name"), f"{name!r} should match a DNS-1035 label (lower-case letters, digits "
                        "and '-', starting with a letter, at most 63): the PyTorchJob webhook rejects it")
    spec = obj.get("spec") or {}
    managed_by = (spec.get("runPolicy") or {}).get("managedBy")
    if managed_by is not None and managed_by not in ("kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue"):
        yield Violation(("spec", "runPolicy", "managedBy"), f"unsupported value {managed_by!r}")
    replicas = spec.get("pytorchReplicaSpecs")
    if not replicas:
        yield Violation(("spec", "pytorchReplicaSpecs"), "required")
    elastic = spec.get("elasticPolicy")
    if elastic is not None and "Worker" not in (replicas or {}):
        yield Violation(("spec", "pytorchReplicaSpecs", "Worker"), "must be configured if elastic policy is used")
    if elastic and elastic.get("nProcPerNode") is not None and spec.get("nprocPerNode") is not None:
        yield Violation(("spec", "elasticPolicy", "nProcPerNode"), "must not be used with spec.nprocPerNode")
    for parts, rtype, replica in replica_templates(obj):
        if rtype not in ("Master", "Worker"):
            yield Violation(parts, f"unsupported replica type {rtype!r}: Master or Worker")
        containers = ((replica.get("template") or {}).get("spec") or {}).get("containers") or []
        if not any(c.get("name") == "pytorch" for c in containers if isinstance(c, dict)):
            yield Violation(parts + ("template", "spec", "containers"), "must have at least one container with name "
                            "pytorch (the operator sets the PET_* variables in that one)")
        count = replica.get("replicas")
        if rtype == "Master" and count != 1:
            yield Violation(parts + ("replicas",), "must be 1")
        elif rtype != "Master" and count is not None and count < 1:
            yield Violation(parts + ("replicas",), "must be at least 1")


def _mpi_job(obj: dict) -> Iterator[Violation]:
    spec = obj.get("spec") or {}
    replicas = spec.get("mpiReplicaSpecs") or {}
    worker = replicas.get("Worker") or {}
    count = worker.get("replicas") or 1
    host = f"{(obj.get('metadata') or {}).get('name') or ''}-worker-{max(count, 1) - 1}"
    if not dns1035_label(host):
        yield Violation(("metadata", "name"), f"the last worker's host name {host!r} is not a DNS-1035 label: the "
                        "operator cannot create its pod and service")
    if (spec.get("slotsPerWorker") or 0) < 0:
        yield Violation(("spec", "slotsPerWorker"), "must be greater than or equal to 0")
    policy = spec.get("runPolicy") or {}
    clean = policy.get("cleanPodPolicy") or "None"  # the defaults (default.go) come first
    if clean not in ("None", "Running", "All"):
        yield Violation(("spec", "runPolicy", "cleanPodPolicy"), f"unsupported value {clean!r}")
    for key in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        if (policy.get(key) or 0) < 0:
            yield Violation(("spec", "runPolicy", key), "must be greater than or equal to 0")
    if policy.get("managedBy") not in (None, "kubeflow.org/mpi-operator", "kueue.x-k8s.io/multikueue"):
        yield Violation(("spec", "runPolicy", "managedBy"), f"unsupported value {policy['managedBy']!r}")
    if (spec.get("mpiImplementation") or "OpenMPI") not in ("OpenMPI", "Intel", "MPICH"):
        yield Violation(("spec", "mpiImplementation"), f"unsupported value {spec['mpiImplementation']!r}")
    if "Launcher" not in replicas:
        yield Violation(("spec", "mpiReplicaSpecs", "Launcher"), "must have Launcher replica spec")
    # types.go declares this enum, but its marker lacks the `=` controller-gen needs, so the published CRD admits
    # any string; the controller then starts the launcher at once only for AtStartup
    if (spec.get("launcherCreationPolicy") or "AtStartup") not in ("AtStartup", "WaitForWorkersReady"):
        yield Violation(("spec", "launcherCreationPolicy"), f"unsupported value {spec['launcherCreationPolicy']!r}: "
                        "AtStartup or WaitForWorkersReady (the operator treats any other value as waiting for all "
                        "workers)")
    for parts, rtype, replica in replica_templates(obj):
        default_restart = "OnFailure" if rtype == "Launcher" else "Never"
        if (replica.get("restartPolicy") or default_restart) not in ("Never", "OnFailure"):
            yield Violation(parts + ("restartPolicy",), f"unsupported value {replica['restartPolicy']!r}: Never or "
                            "OnFailure")
        if not ((replica.get("template") or {}).get("spec") or {}).get("containers"):
            yield Violation(parts + ("template", "spec", "containers"), "must define at least one container")
        count = replica.get("replicas")
        count = (1 if rtype == "Launcher" else 0) if count is None else count
        if rtype == "Launcher" and count != 1:
            yield Violation(parts + ("replicas",), "must be 1")
        elif rtype == "Worker" and count <= 0:
            yield Violation(parts + ("replicas",), "must be greater than or equal to 1")
