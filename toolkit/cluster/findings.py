"""A finding about a cluster config: what is wrong (or worth knowing), where, and how to fix it."""

from __future__ import annotations

import dataclasses
from typing import Literal

Level = Literal["error", "warning", "info"]


@dataclasses.dataclass(frozen=True)
class Finding:
    level: Level
    path: str  # key path with names, e.g. Scheduling/SlurmQueues[p3dn]/ComputeResources[p3dn-24xl]/MaxCount
    message: str
    fix: str | None = None
    file: str | None = None
    line: int | None = None
    source: str = "hpc"  # "hpc", "yaml", "schema", or the pcluster validator's name

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def has_errors(findings: list[Finding]) -> bool:
    return any(f.level == "error" for f in findings)
