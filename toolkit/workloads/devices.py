"""The devices our workloads run on (--device) and each one's native collective backend, as the accelerator families
answer them (toolkit.accelerators: torch_device, collective), and the runtime module of a family whose devices torch
alone cannot drive from a rank (Family.workload_runtime: a vendor's PyTorch bridge). Our workloads ask here instead
of naming a family's device.

A runtime module has: DEVICE (torch's device type), LABEL (the device in nccl-tests' device table), NEEDS (what
--device needs, in help), AMP_DTYPE and AMP_NAME (its autocast dtype, None: no mixed precision), LAZY (its ops only
queue a graph that runs at the bridge's mark_step: the host clock times nothing), load_bridge(local_rank) (the
bridge, with mark_step()), synchronize(), and reduce_dtype(torch, device).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from toolkit.accelerators import FAMILIES

DEVICES = tuple(family.torch_device for family in FAMILIES.values())  # the registry's order
BACKENDS = {family.torch_device: family.collective for family in FAMILIES.values()}  # --device: its native backend
ANYWHERE = BACKENDS["cpu"]  # the CPU's collective (gloo), which runs whatever the device


def _runtimes() -> list[tuple[str, ModuleType]]:
    return [(family.torch_device, importlib.import_module(family.workload_runtime)) for family in FAMILIES.values()
            if family.workload_runtime]


def runtime(device: str) -> ModuleType | None:
    """The runtime module for --device `device`, or None where torch alone drives it."""
    return next((module for torch_device, module in _runtimes() if torch_device == device), None)


def of(device) -> ModuleType | None:
    """The runtime module whose devices a torch.device is (by its type), or None."""
    return next((module for _, module in _runtimes() if device.type == module.DEVICE), None)


def reduce_dtype(torch, device):
    """The dtype for statistics all-reduced on a torch.device: float64 unless its runtime says otherwise."""
    module = of(device)
    return module.reduce_dtype(torch, device) if module is not None else torch.float64


def each(template: str, last: str = ", ") -> str:
    """`template` ({device}, {backend}) said for every device, in messages; `last` joins the last one."""
    said = [template.format(device=device, backend=backend) for device, backend in BACKENDS.items()]
    return last.join([", ".join(said[:-1]), said[-1]]) if len(said) > 1 else "".join(said)


def needs() -> str:
    """What the devices with a runtime need, in --device help: "DEVICE needs ...; ..."."""
    return "; ".join(f"{device} {module.NEEDS}" for device, module in _runtimes())


def amp_forms() -> str:
    """The runtimes' mixed precision, in --amp help: "bf16 autocast on DEVICE"."""
    return ", ".join(f"{module.AMP_NAME} autocast on {device}" for device, module in _runtimes() if module.AMP_DTYPE)
