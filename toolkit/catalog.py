"""The instance catalog: public facts per EC2 instance type, read from catalog.yaml (the only place they live)."""

from __future__ import annotations

import dataclasses
import functools
from importlib import resources
from typing import Literal

from toolkit.errors import HpcError

Accelerator = Literal["nvidia", "gaudi", "none"]


@dataclasses.dataclass(frozen=True)
class InstanceType:
    name: str
    accelerator: Accelerator
    gpus: int
    vcpus: int
    cores: int
    memory_gib: int
    network_gbps: int
    network_cards: int
    efa_interfaces: int
    gpudirect_rdma: bool
    proprietary_driver: bool
    gpu_model: str | None = None
    gpu_memory_gib: int | None = None
    instance_store_gb: int = 0
    network_interfaces: int | None = None

    @property
    def has_efa(self) -> bool:
        return self.efa_interfaces > 0

    @property
    def is_gpu(self) -> bool:
        return self.accelerator == "nvidia"

    @property
    def threads_per_core(self) -> int:
        return self.vcpus // self.cores


@functools.cache
def catalog() -> dict[str, InstanceType]:
    import yaml

    text = resources.files("toolkit").joinpath("catalog.yaml").read_text()
    entries = yaml.safe_load(text)["instances"]
    return {name: InstanceType(name=name, **facts) for name, facts in entries.items()}


def instance(name: str) -> InstanceType:
    """The catalog entry for an instance type, or an error that lists the known ones."""
    try:
        return catalog()[name]
    except KeyError:
        known = ", ".join(sorted(catalog()))
        raise HpcError(
            f"instance type {name!r} is not in the toolkit's catalog",
            fix=f"use one of: {known} (or add its facts to toolkit/catalog.yaml)",
        ) from None
