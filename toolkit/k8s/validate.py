"""`hpc k8s validate`: Kubernetes manifests checked offline, as `kubectl apply` and the API server would.

No cluster is contacted. The file is read as kubectl reads it (toolkit.k8s.kubeyaml: go-yaml v2's rules, so an
unquoted `1e-4` is a number), then each document is checked in layers, each finding naming the document, the
field's path and the fix:
  - custom resources (PyTorchJob kubeflow.org/v1, MPIJob kubeflow.org/v2beta1, any CRD vendored in crds/)
    against the operator's published CRD with the API server's structural-schema semantics (toolkit.k8s.crd);
    core kinds (PersistentVolumeClaim, StorageClass, ConfigMap, ...) against the Kubernetes OpenAPI schemas
    (toolkit.k8s.coreschema); both strict, as kubectl's --validate=strict; a ConfigMap's size against the API
    server's limit (and client-side apply's copy of it in an annotation);
  - the jobs' pod templates against the core PodTemplateSpec schema (strict) and the core API's pod validation,
    and each job against its operator's admission rules (toolkit.k8s.admission); a Trainer v2 runtime's template
    against JobSet's admission and the MPI plugin's launcher count (runtime_violations);
  - the toolkit's checks: GPUs and EFA devices against the instance type's catalog facts, processes per node and
    slots against the GPUs, workers against the nodes the job was made for, the MPI launcher's start, claims that
    are not ReadWriteMany, values left to fill in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from toolkit.cluster.findings import Finding, has_errors
from toolkit.k8s.violations import Violation, key_path

_LEVEL_ORDER = {"error": 0, "warning": 1, "info": 2}
POD_TEMPLATE = "io.k8s.api.core.v1.PodTemplateSpec"


def _findings(violations, where: str, source: str) -> list[Finding]:
    return [Finding(v.level, f"{where}: {v.path}", v.message, v.fix or _fix(v.message), source=source)
            for v in violations]


def _fix(message: str) -> str | None:
    if message.startswith("must be one of"):
        return "use one of the values listed"
    if message.startswith("must be equal to"):
        return "request exactly the limit (or give only the limit: the request defaults to it)"
    if message.startswith("Limit must be set"):
        return "give the same quantity under limits"
    if message.startswith("not checked offline"):
        return None
    return "give a value the schema allows"


def _schema_findings(doc: dict, where: str) -> list[Finding]:
    from toolkit.k8s import coreschema
    from toolkit.k8s.admission import operator_violations, replica_templates
    from toolkit.k8s.crd import find_crd, validate_against_crd

    kind, api_version = doc.get("kind"), doc.get("apiVersion")
    if not isinstance(kind, str) or not isinstance(api_version, str):
        return [Finding("error", f"{where}: {'kind' if not isinstance(kind, str) else 'apiVersion'}",
                        "every Kubernetes document needs apiVersion and kind", "add them (e.g. apiVersion: v1, "
                        "kind: PersistentVolumeClaim)", source="schema")]
    crd = find_crd(api_version, kind)
    if crd is not None:
        from toolkit.k8s.trainer_v2 import CEL_RULES_CHECKED

        found = [v for v in validate_against_crd(doc, crd) if v.rule not in CEL_RULES_CHECKED]
        if any(v.parts == ("apiVersion",) for v in found):
            return [Finding("error", f"{where}: apiVersion", found[0].message, f"set apiVersion: "
                            f"{crd.api_versions[-1]}", source="crd")]
        findings = _findings(found, where, "crd")
        if any(v.level == "error" for v in found):
            return findings  # rejected at the schema: no admission webhook runs, no pod is made
        # the operator's admission rules, then the pods it will create: the core schema (strict, the cluster's
        # Kubernetes version) and the API server's pod validation
        for parts, _, replica in replica_templates(doc):
            template = replica.get("template")
            if isinstance(template, dict):
                core = coreschema.definition_violations(POD_TEMPLATE, template, parts + ("template",))
                findings += _findings(core, where, "schema")
        return findings + _findings([*operator_violations(doc), *runtime_violations(doc)], where, "admission")
    schema = coreschema.kind_schema(kind, api_version)
    if schema is None:
        versions = coreschema.api_versions(kind)
        if versions:
            return [Finding("error", f"{where}: apiVersion", f"Kubernetes {coreschema.KUBERNETES_VERSION} serves "
                            f"{kind} as {', '.join(versions)}, not {api_version}", f"set apiVersion: {versions[-1]}",
                            source="schema")]
        return [Finding("error", f"{where}: kind", f"{kind} ({api_version}) is neither a Kubernetes "
                        f"{coreschema.KUBERNETES_VERSION} kind nor a custom resource with a CRD in toolkit/k8s/crds",
                        "fix the kind's spelling, or validate it with the tools of the operator that defines it",
                        source="schema")]
    findings = _findings(coreschema.schema_violations(coreschema.validator(schema), doc), where, "schema")
    return findings if has_errors(findings) or kind != "ConfigMap" else _configmap_findings(doc, where)


def _configmap_findings(doc: dict, where: str) -> list[Finding]:
    """A ConfigMap's size: the API server's limit on its data, and client-side apply's on its copy of it."""
    from toolkit.k8s.usercode import ANNOTATIONS_MAX_BYTES, CONFIGMAP_MAX_BYTES, LAST_APPLIED, data_bytes, \
        last_applied_bytes

    size = data_bytes(doc)
    if size > CONFIGMAP_MAX_BYTES:  # kubernetes/kubernetes pkg/apis/core/validation/validation.go ValidateConfigMap
        return [Finding("error", f"{where}: data", f"{size} bytes of data: the API server refuses a ConfigMap over "
                        f"{CONFIGMAP_MAX_BYTES} bytes (1 MiB)", "put the files in the image instead (hpc k8s render "
                        "SCRIPT.py --image IMAGE)", source="admission")]
    applied = last_applied_bytes(doc)
    if applied > ANNOTATIONS_MAX_BYTES:  # kubernetes/apimachinery pkg/api/validation/objectmeta.go
        return [Finding("warning", f"{where}: metadata.annotations", f"client-side `kubectl apply` (and hpc k8s "
                        f"apply) would keep a {applied}-byte copy of this ConfigMap in its {LAST_APPLIED} "
                        f"annotation; the API server refuses annotations over {ANNOTATIONS_MAX_BYTES} bytes",
                        "apply the file with `kubectl apply --server-side -f FILE`", source="admission")]
    return []


def runtime_violations(doc: dict) -> Iterator[Violation]:
    """What becomes of a (Cluster)TrainingRuntime's template when a TrainJob runs on it: the JobSet the Trainer
    makes of it must pass JobSet's admission, and an MPI runtime must start one launcher. Neither is checked when
    the runtime is created (kubeflow/trainer v2.3.0 pkg/webhooks/trainingruntime_webhook.go checks only the
    ancestor jobs' replicas and containers): the TrainJob's JobSet is refused, or runs, later."""
    from toolkit.k8s.trainer_v2 import ANCESTOR_LABEL, LAUNCHER

    if doc.get("kind") not in ("TrainingRuntime", "ClusterTrainingRuntime"):
        return
    spec = found if isinstance(found := doc.get("spec"), dict) else {}
    template = (spec.get("template") or {}).get("spec") or {}
    jobs = [job for job in template.get("replicatedJobs") or [] if isinstance(job, dict)]
    base: tuple = ("spec", "template", "spec", "replicatedJobs")
    # kubernetes-sigs/jobset v0.12.0 (Trainer v2.3.0's go.mod) pkg/webhooks/jobset_webhook.go validateCreate: the
    # first replicated job has no dependsOn, and each dependsOn names one listed before (a job naming itself
    # passes the webhook but never starts: refused here too)
    earlier: list[str] = []
    for j, job in enumerate(jobs):
        for d, needs in enumerate(job.get("dependsOn") or []):
            needed = needs.get("name") if isinstance(needs, dict) else None
            if j == 0:
                yield Violation((*base, 0, "dependsOn"), "DependsOn can't be set for the first ReplicatedJob: "
                                "JobSet's admission refuses the JobSet every TrainJob on this runtime makes",
                                fix=f"list {needed or 'the job it depends on'} before {job.get('name')}")
                break
            if needed not in earlier:
                yield Violation((*base, j, "dependsOn", d, "name"), f"replicatedJob: {job.get('name')} cannot "
                                f"depend on replicatedJob: {needed} (JobSet's admission: only on one listed before "
                                "it)", fix=f"list {needed} before {job.get('name')}")
        earlier.append(str(job.get("name")))
    # The MPI launcher count: the trainer-ancestor job gets mlPolicy.numNodes pods (kubeflow/trainer v2.3.0
    # pkg/runtime/core/trainingruntime.go newRuntimeInfo; the jobset plugin's SyncParallelCount), while the MPI
    # plugin sizes `node` from the TrainJob (pkg/runtime/framework/plugins/mpi/mpi.go EnforceMLPolicy): N launcher
    # pods would each run mpirun over the same nodes. Upstream's MPI runtimes set 1
    # (manifests/base/runtimes/deepspeed_distributed.yaml, mlx_distributed.yaml).
    policy = spec.get("mlPolicy") or {}
    def labels(job: dict) -> dict:
        return ((job.get("template") or {}).get("metadata") or {}).get("labels") or {}

    launchers = [job for job in jobs if job.get("name") == LAUNCHER and labels(job).get(ANCESTOR_LABEL) == "trainer"]
    count = policy.get("numNodes", 1)
    if policy.get("mpi") is not None and launchers and count != 1:
        yield Violation(("spec", "mlPolicy", "numNodes"), f"{count}: on an MPI runtime this is the number of "
                        f"launcher pods (the trainer-ancestor job {LAUNCHER!r}), each running mpirun over the same "
                        "nodes", fix="set mlPolicy.numNodes: 1; the TrainJob's spec.trainer.numNodes sets the "
                        "nodes (the MPI plugin sizes the `node` job from it)")


def _count(value: Any) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None


def _pod_templates(doc: dict) -> Iterator[tuple[list, dict, int]]:
    """(key path, pod template, replicas) of a Kubeflow job's replicas."""
    from toolkit.k8s.admission import replica_templates

    for parts, _, replica in replica_templates(doc):
        if isinstance(replica.get("template"), dict):
            yield list(parts) + ["template"], replica["template"], _count(replica.get("replicas") or 1) or 1


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
        findings += _workers_vs_nodes(where, doc)
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
            findings += _claims(where, pod, tpath, replicas, claims)
    return findings


def _claims(where: str, pod: dict, tpath: list, replicas: int, claims: dict) -> list[Finding]:
    findings = []
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
                f"claim {name} is {', '.join(map(str, modes)) or 'without access modes'}, but {replicas} pods on "
                f"different nodes mount it ({where})",
                "use accessModes: [ReadWriteMany] (FSx for Lustre through fsx.csi.aws.com supports it)"))
    return findings


def _workers_vs_nodes(where: str, doc: dict) -> list[Finding]:
    """Worker pods against the nodes the job was made for: torchrun's node range, mpirun's process count."""
    spec = found if isinstance(found := doc.get("spec"), dict) else {}
    if doc.get("kind") == "PyTorchJob":
        elastic = spec.get("elasticPolicy") or {}
        workers = ((spec.get("pytorchReplicaSpecs") or {}).get("Worker") or {}).get("replicas")
        low, high = elastic.get("minReplicas"), elastic.get("maxReplicas")
        if isinstance(workers, int) and isinstance(low, int) and isinstance(high, int) and not low <= workers <= high:
            return [Finding("error", f"{where}: spec.pytorchReplicaSpecs.Worker.replicas",
                            f"{workers} worker pods, but torchrun's rendezvous takes {low}" + (f" to {high}" if high
                            != low else "") + " nodes (elasticPolicy minReplicas/maxReplicas; the world size, "
                            "update-freq and LR were derived for that many)",
                            f"set replicas: {high}, or render the job again for {workers} nodes (hpc k8s render "
                            f"--nodes {workers})")]
    if doc.get("kind") == "MPIJob":
        replicas = spec.get("mpiReplicaSpecs") or {}
        workers = (replicas.get("Worker") or {}).get("replicas")
        slots = spec.get("slotsPerWorker", 1)
        launcher = ((((replicas.get("Launcher") or {}).get("template") or {}).get("spec") or {}).get("containers")
                    or [{}])[0]
        args = [str(a) for a in launcher.get("args") or []]
        np = _count(args[args.index("-np") + 1]) if "-np" in args[:-1] else None
        if isinstance(workers, int) and isinstance(slots, int) and np is not None and np != workers * slots:
            return [Finding("error", f"{where}: spec.mpiReplicaSpecs.Worker.replicas",
                            f"{workers} workers x {slots} slots = {workers * slots} MPI slots, but the launcher runs "
                            f"mpirun -np {np}", f"set replicas: {np // slots if slots else np}, or render the job "
                            "again for this many nodes")]
        policy = spec.get("launcherCreationPolicy", "AtStartup")
        if policy != "WaitForWorkersReady":
            return [Finding("warning", f"{where}: spec.launcherCreationPolicy",
                            f"{policy}: the launcher starts mpirun before the workers are ready; workers still "
                            "pulling a multi-GB image are unreachable and the job fails",
                            "set launcherCreationPolicy: WaitForWorkersReady")]
    return []


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
    return f"document {index} ({doc.get('kind', '?')}{'/' + str(name) if name else ''})"


def validate_text(text: str, file: str = "<manifests>") -> dict:
    """The findings for a multi-document manifest file: {"file", "valid", "documents", "findings"}."""
    from toolkit.k8s.kubeyaml import KubectlYamlError, load_all

    try:
        loaded = load_all(text)
    except KubectlYamlError as exc:
        findings = [Finding("error", f"line {exc.line}" if exc.line else "(file)", exc.message,
                            "fix the YAML (kubectl reads it with go-yaml v2's rules)", file=file, line=exc.line,
                            source="yaml")]
        return {"file": file, "valid": False, "documents": [], "findings": [f.as_dict() for f in findings]}
    findings = []
    docs = []
    for index, doc in enumerate(loaded, 1):
        if not isinstance(doc, dict):
            findings.append(Finding("error", f"document {index}", "a Kubernetes document is a mapping",
                                    "remove the stray text between the `---` lines", source="yaml"))
            continue
        where = _describe(index, doc)
        found = _schema_findings(doc, where)
        findings += found
        docs.append((where, doc, not has_errors(found)))
    if not loaded:
        findings.append(Finding("error", "(file)", "no Kubernetes documents in the file",
                                "render some: hpc k8s render RECIPE --nodes N --instance TYPE -o FILE"))
    findings += _our_findings([(w, d) for w, d, admitted in docs if admitted])  # documents the schemas admitted
    findings = sorted((Finding(**{**f.as_dict(), "file": file}) for f in findings),
                      key=lambda f: _LEVEL_ORDER[f.level])
    return {"file": file, "valid": not has_errors(findings), "documents": [w for w, _, _ in docs],
            "findings": [f.as_dict() for f in findings]}


def validate_file(path: str | Path) -> dict:
    from toolkit.textfile import read_text

    text = read_text(path, "manifest", fix="pass a manifest file (hpc k8s render ... -o FILE)")
    return validate_text(text, str(path))
