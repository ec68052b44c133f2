"""Kubernetes as a target (toolkit.target's interface): the dry run is the rendered manifests (toolkit.k8s.manifests,
checked offline by toolkit.k8s.validate); scheduling is `kubectl apply` where kubectl and a current context exist
on this machine, else one clear refusal that names the file to apply where they do. No cluster is contacted until
then, and a file the offline checks refuse is never applied."""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from toolkit.errors import HpcError
from toolkit.target import Dispatch

KUBECTL_TIMEOUT_S = 60
# A Kubeflow job's last condition (kubeflow/trainer pkg/apis/kubeflow.org/v1/common_types.go JobConditionType;
# Trainer v2 TrainJob: Complete / Failed) -> hpc's states (toolkit.slurm.status.State's names)
CONDITION_STATES = {"Succeeded": "COMPLETED", "Complete": "COMPLETED", "Failed": "FAILED", "Running": "RUNNING",
                    "Created": "PENDING", "Restarting": "RUNNING", "Suspended": "SUSPENDED"}


@dataclasses.dataclass(frozen=True)
class Apply:
    """What `hpc k8s apply` schedules: a file of rendered manifests, and the kubectl context to apply it in."""

    manifests: Path
    context: str | None = None


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """A kubectl command with a timeout: a cluster that does not answer is an error, not a hang."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=KUBECTL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise HpcError(f"`{shlex.join(argv)}` did not answer in {KUBECTL_TIMEOUT_S} s",
                       fix="check the cluster's endpoint and your network (`kubectl cluster-info`)") from None


def kubectl(context: str | None = None) -> list[str]:
    """kubectl's argv prefix, after checking it can reach a cluster: installed here, with a context."""
    path = shutil.which("kubectl")
    if path is None:
        raise HpcError("kubectl is not installed here, so the manifests cannot be applied from this machine",
                       fix="apply the rendered file where kubectl reaches your EKS cluster (`kubectl apply -f FILE`), "
                           "or install kubectl and run `aws eks update-kubeconfig --name CLUSTER` first")
    argv = [path, *(["--context", context] if context else [])]
    res = run([*argv, "config", "current-context"])
    if res.returncode != 0:
        raise HpcError(f"kubectl has no {'context ' + context if context else 'current context'} to apply to",
                       fix="run `aws eks update-kubeconfig --name CLUSTER` (or `kubectl config use-context NAME`), "
                           "or give --context NAME")
    return argv


class Kubernetes:
    kind = "kubernetes"
    summary = "kubectl apply, the rendered manifests"
    scheduler = "kubernetes"

    def sweep_refusal(self, recipe: str) -> HpcError | None:
        return HpcError(f"recipe {recipe}: a sweep is a Slurm job array, which Kubernetes has no form of here",
                        fix="render one manifest per variation (`hpc k8s render ... --set KEY=VALUE -o DIR`)")

    def dry_run(self, spec: Any, run_dir: Path, *, array: bool = False) -> Dispatch:
        return Dispatch(argv=("kubectl", "apply", "-f", str(Path(run_dir) / "manifests.yaml")))

    def describe(self, dispatch: Dispatch) -> str:
        return "kubectl: " + shlex.join(dispatch.argv or ())

    def check(self, plan: Apply) -> None:
        """The offline checks pass (the CRDs as kubectl sends them, the core schemas, admission rules), and kubectl
        can reach a cluster."""
        from toolkit.k8s.validate import validate_file

        report = validate_file(plan.manifests)
        if not report["valid"]:
            first = next(f for f in report["findings"] if f["level"] == "error")
            raise HpcError(f"{plan.manifests}: not applied: {first['path']}: {first['message']}",
                           fix=first["fix"] or f"see `hpc k8s validate {plan.manifests}`")
        kubectl(plan.context)

    def schedule(self, plan: Apply) -> str:
        """`kubectl apply -f FILE -o name`: the names of what was created ("trainjob.trainer.kubeflow.org/x ...")."""
        self.check(plan)
        res = run([*kubectl(plan.context), "apply", "-f", str(plan.manifests), "-o", "name"])
        if res.returncode != 0:
            raise HpcError(f"kubectl refused the manifests: {(res.stderr or res.stdout).strip().splitlines()[-1:]}",
                           fix=f"see `kubectl apply -f {plan.manifests}`'s full output")
        return " ".join(res.stdout.split())

    def status(self, job_ids: list[str], run: Any) -> dict[str, Any]:
        """Each job's state by its last condition (`kubectl get NAME -o json`)."""
        from toolkit.slurm.status import JobStatus, State

        out = {}
        for name in job_ids:
            res = run([*kubectl(), "get", name, "-o", "json"])
            found = json.loads(res.stdout) if res.returncode == 0 else {}
            conditions = found.get("status", {}).get("conditions") or []
            state = CONDITION_STATES.get(conditions[-1].get("type"), "UNKNOWN") if conditions else "UNKNOWN"
            out[name] = JobStatus(name, State.parse(state), "kubectl")
        return out

    def cancel(self, job_ids: list[str]) -> None:
        res = run([*kubectl(), "delete", *job_ids])
        if res.returncode != 0:
            raise HpcError(f"kubectl could not delete {' '.join(job_ids)}: {res.stderr.strip()}",
                           fix="check the names with `kubectl get`")

    def logs(self, run: Any, job_id: str, rank: int, stream: str = "out") -> Path | None:
        return None  # the pods' logs stay in the cluster: `kubectl logs`
