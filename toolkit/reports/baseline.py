"""Bandwidth baselines from the fleet itself: the bus bandwidth of earlier healthy collective runs of the same
instance type, node count, collective and message size (toolkit.node.ledger's baseline records), so that a run is
judged against what this cluster does, not a figure from a blog post, once the fleet has MIN_RUNS such runs.

The bound is robust: median - max(3 x 1.4826 x MAD, MIN_MARGIN x median). The median and the median absolute
deviation (MAD) ignore up to half the samples being odd (a slow run that slipped into the baseline does not drag the
bound down as a mean and standard deviation would); 1.4826 x MAD estimates the standard deviation of normal noise,
so 3 of it is a lower bound a healthy run falls under about once in 700 runs. Five runs can agree closely by chance
(MAD near 0), so the bound is never nearer the median than MIN_MARGIN of it: run-to-run noise of any fabric.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Iterable, Mapping

MIN_RUNS = 5
MAD_SIGMA = 1.4826  # MAD -> standard deviation, for normal noise
SIGMAS = 3.0
MIN_MARGIN = 0.10


@dataclasses.dataclass(frozen=True)
class Baseline:
    instance_type: str
    nodes: int
    test: str
    size: int
    runs: int
    median_gbs: float
    mad_gbs: float

    @property
    def bound_gbs(self) -> float:
        return self.median_gbs - max(SIGMAS * MAD_SIGMA * self.mad_gbs, MIN_MARGIN * self.median_gbs)

    @property
    def enough(self) -> bool:
        return self.runs >= MIN_RUNS

    def describe(self) -> str:
        return (f"the fleet's baseline from {self.runs} runs ({self.instance_type}, {self.nodes} node(s), "
                f"{self.test}): "
                f"median {self.median_gbs:.3g} GB/s, MAD {self.mad_gbs:.3g}, bound {self.bound_gbs:.3g} GB/s "
                f"(median - max(3 x 1.4826 x MAD, {MIN_MARGIN:.0%} of the median))")


def samples(records: Iterable[Mapping[str, Any]], instance_type: str, nodes: int, test: str,
            size: int) -> list[float]:
    """The fleet's bus bandwidths for this shape, one per recorded run (a job recorded twice counts once)."""
    seen: dict[Any, float] = {}
    for r in records:
        if (r.get("type") == "baseline" and r.get("instance_type") == instance_type and r.get("nodes") == nodes
                and r.get("test") == test and r.get("size") == size and isinstance(r.get("busbw_gbs"), (int, float))):
            key = (r.get("job"), r.get("source")) if r.get("job") else (r.get("time"),)
            seen[key] = float(r["busbw_gbs"])
    return list(seen.values())


def learn(records: Iterable[Mapping[str, Any]], instance_type: str, nodes: int, test: str,
          size: int) -> Baseline | None:
    """The baseline for this shape, or None when the fleet has no run of it."""
    values = samples(records, instance_type, nodes, test, size)
    if not values:
        return None
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    return Baseline(instance_type, nodes, test, size, len(values), median, mad)
