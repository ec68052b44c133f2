"""Accelerator families: what a node's devices mean for a job, one module each (nvidia, gaudi, cpu), found by the
catalog's `accelerator` field (toolkit/catalog.yaml). Callers ask family(...) the questions of
toolkit.accelerators.base.Family (device form, GRES, CPU binding, collective, environment, loader checks, cluster
health checks and AMI, Kubernetes resource) instead of branching on a family's name.

Neuron (the catalog's Trainium and Inferentia types) and Qualcomm (dl2q's Cloud AI 100) are in the catalog, so
clusters of them can be built and validated, but they have no family: their own runtimes and compilers (torch-neuronx,
neuronx-cc; Qualcomm's Cloud AI SDKs), launchers and collectives (not NCCL) are not done here. family() refuses them,
in this one place."""

from __future__ import annotations

from typing import Mapping

from toolkit.accelerators.base import Family
from toolkit.accelerators.cpu import CPU
from toolkit.accelerators.gaudi import GAUDI
from toolkit.accelerators.nvidia import NVIDIA
from toolkit.catalog import InstanceType
from toolkit.errors import HpcError

FAMILIES: Mapping[str, Family] = {f.kind: f for f in (NVIDIA, GAUDI, CPU)}
# Catalog accelerators that have no family, and why (the one place they are refused).
REFUSED = {"neuron": "its own runtime, compiler and collectives (torch-neuronx / neuronx-cc), which hpc does not "
                     "drive",
           "qualcomm": "Qualcomm's Cloud AI SDKs (an inference accelerator's own compiler and runtime), which hpc does "
                       "not drive"}


def family(of: InstanceType | str, where: str | None = None) -> Family:
    """The family of an instance type's devices (or of a catalog `accelerator` value); HpcError for one without a
    family (Neuron). `where` names it in the error (a queue: "queue trn1 (trn1.32xlarge)"; default: the type)."""
    kind = of if isinstance(of, str) else of.accelerator
    found = FAMILIES.get(kind)
    if found is not None:
        return found
    why = REFUSED.get(kind, "a module in toolkit/accelerators, which it lacks")
    what = f"accelerator {kind!r}" if isinstance(of, str) else f"{where or of.name} has {of.gpu_model} ({kind})"
    raise HpcError(f"{what} accelerators: hpc makes no jobs for them (only GPU, Gaudi HPU and CPU jobs)",
                   fix=f"choose a GPU, Gaudi or CPU queue (--cluster FILE --queue Q) or instance type: {kind} needs "
                       f"{why}")


def family_or_none(of: InstanceType) -> Family | None:
    """The family of an instance type's devices, or None where family() refuses it: for the cluster side, which
    builds and validates clusters of any catalog type (a Trainium queue gets no family's health checks)."""
    return FAMILIES.get(of.accelerator)


def of_device(device: str) -> Family:
    """The family whose device form is `device` (gpu, hpu, cpu: a recipe's runs_on, a run's recorded device)."""
    return next(f for f in FAMILIES.values() if f.device == device)
