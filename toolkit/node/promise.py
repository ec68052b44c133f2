"""What a queue promises on each of its nodes, resolved at plan time from the catalog and the cluster config, and
handed to the node-side checks as JSON: the node never reads the catalog (toolkit.node's contract)."""

from __future__ import annotations

import dataclasses
import json
from typing import Optional, Tuple


@dataclasses.dataclass(frozen=True)
class Promise:
    queue: str
    instance_type: str
    accelerator: str = "none"  # the catalog's accelerator field (toolkit.catalog's Accelerator)
    gpus: int = 0  # accelerators per node (GPUs or another family's devices)
    gpu_model: Optional[str] = None
    proprietary_driver: bool = False  # the GPU needs NVIDIA's proprietary driver (no OpenRM: V100)
    efa_interfaces: int = 0  # what the instance type has (the catalog's), whether or not the queue enables EFA
    efa_stack: str = "none"  # declared: modern | legacy | none
    fabric: str = "none"  # what jobs set up: the declared stack where EFA is enabled, else none (TCP)
    fsx_mount: Optional[str] = None
    plugin_dirs: Tuple[str, ...] = ()  # where EFA jobs' LD_LIBRARY_PATH finds aws-ofi-nccl (toolkit.job.env)

    @property
    def is_gpu(self) -> bool:
        return self.accelerator == "nvidia"

    @property
    def has_efa(self) -> bool:
        return self.efa_interfaces > 0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "Promise":
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in json.loads(text).items() if k in known}
        if "plugin_dirs" in fields:
            fields["plugin_dirs"] = tuple(fields["plugin_dirs"])
        return cls(**fields)
