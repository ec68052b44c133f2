"""The instance catalog: public facts per EC2 instance type, read from catalog.yaml (the only place they live)."""

from __future__ import annotations

import dataclasses
import functools
from importlib import resources
from typing import Literal

from toolkit.errors import HpcError

Accelerator = Literal["nvidia", "gaudi", "neuron", "none"]


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
    architecture: Literal["x86_64", "arm64"] = "x86_64"
    burstable: bool = False  # t2/t3: no cluster placement groups

    @property
    def has_efa(self) -> bool:
        return self.efa_interfaces > 0

    @property
    def is_gpu(self) -> bool:
        return self.accelerator == "nvidia"

    @property
    def threads_per_core(self) -> int:
        return self.vcpus // self.cores


@dataclasses.dataclass(frozen=True)
class NcclFloor:
    """The all-reduce bus bandwidth a healthy fabric reaches (see the nccl_floors comment in catalog.yaml)."""

    instance: str
    transport: Literal["efa", "tcp"]
    min_nodes: int
    min_bytes: int
    published_busbw_gbs: float
    floor_busbw_gbs: float
    source: str
    estimate: bool = False
    max_nodes: int | None = None  # None: any count from min_nodes

    def covers(self, nodes: int) -> bool:
        return self.min_nodes <= nodes and (self.max_nodes is None or nodes <= self.max_nodes)


@functools.cache
def _catalog_data() -> dict:
    import yaml

    return yaml.safe_load(resources.files("toolkit").joinpath("catalog.yaml").read_text())


@functools.cache
def catalog() -> dict[str, InstanceType]:
    entries = _catalog_data()["instances"]
    return {name: InstanceType(name=name, **facts) for name, facts in entries.items()}


@functools.cache
def nccl_floors() -> tuple[NcclFloor, ...]:
    return tuple(NcclFloor(**entry) for entry in _catalog_data().get("nccl_floors", []))


def nccl_floors_for(instance_type: str, transport: str) -> tuple[NcclFloor, ...]:
    """The floors of an instance type (validated against the catalog) over a transport, one per node-count range."""
    instance(instance_type)
    return tuple(f for f in nccl_floors() if f.instance == instance_type and f.transport == transport)


def nccl_floor(instance_type: str, transport: str, nodes: int) -> NcclFloor | None:
    """The floor for a run on `nodes` nodes (a 2-node figure does not hold for more nodes), or None if none is known."""
    return next((f for f in nccl_floors_for(instance_type, transport) if f.covers(nodes)), None)


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
