"""Straggling ranks and nodes, from the per-rank step times the ranks' heartbeats keep (toolkit.node.heartbeat).

In a data-parallel job every rank's step takes as long as the slowest rank's: the others wait for it in the
gradient all-reduce. So a straggler is found by the work no collective holds back, a rank's own work per step:
its data wait plus its forward pass (our ResNet trainer times both). The baseline is the lower quartile of the
ranks' own work, what the faster ranks take: a median would sit between the healthy and the slow ranks when a
slow node holds a large share of them (half, on 2 nodes). A rank whose own work exceeds the baseline by more than
the threshold is flagged, with the likely cause: the phase that grew most over the ranks' median for it (data:
its loading, the storage or too few loader workers; compute: a slow or throttled device or CPU). A node all of
whose ranks are flagged is named as the node to look at. Nothing is judged from fewer than MIN_TIMED_STEPS steps
(medians of a handful of steps on a shared machine differ by 40%), nor where ranks passed no phase times (a
script calling beat(step) alone): the report says why.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Sequence

from toolkit.node.heartbeat import Beat

OWN_WORK = ("data", "compute")  # the phases no collective holds back
DEFAULT_THRESHOLD = 0.5  # flagged above the baseline (the lower quartile of own work) by this fraction
MIN_TIMED_STEPS = 10


@dataclasses.dataclass(frozen=True)
class RankTiming:
    rank: int
    node: str
    steps: int
    step_ms: float
    phases_ms: dict[str, float]  # data, compute, sync: median milliseconds per step
    own_ms: float  # data + compute
    vs_baseline: float  # own_ms / the baseline
    slow: bool
    cause: str | None  # data | compute, for a slow rank


@dataclasses.dataclass(frozen=True)
class Stragglers:
    ranks: list[RankTiming]
    baseline_own_ms: float | None  # the lower quartile of the ranks' own work
    threshold: float
    lines: list[str]  # one per slow rank, then one per node all of whose ranks are slow
    note: str | None = None  # why no judgement could be made

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


CAUSES = {"data": "its data loading is slow (the storage, or too few loader workers for the node's CPUs)",
          "compute": "its compute is slow (a throttled or faulty GPU, or a CPU shared with other work)"}


def find_stragglers(beats: Sequence[Beat], threshold: float = DEFAULT_THRESHOLD) -> Stragglers:
    """Flag the ranks whose own work per step is more than `threshold` above the baseline."""
    timed = [b for b in beats if b.timed_steps and all(p in b.medians for p in OWN_WORK)]
    if len(timed) < 2:
        why = ("fewer than 2 ranks timed their steps' phases (data, compute): beat(step) alone gives only step "
               "times, which are equal on every rank of a synchronous job") if beats else "no heartbeats"
        return Stragglers([], None, threshold, [], why)
    own = {b.rank: sum(b.medians[p] for p in OWN_WORK) for b in timed}
    baseline = statistics.quantiles(own.values(), n=4, method="inclusive")[0]
    medians = {p: statistics.median(b.medians[p] for b in timed) for p in OWN_WORK}
    fewest = min(b.timed_steps for b in timed)
    judged = fewest >= MIN_TIMED_STEPS
    rows = []
    for b in timed:
        ratio = own[b.rank] / baseline if baseline > 0 else 1.0
        slow = judged and ratio > 1 + threshold
        cause = max(OWN_WORK, key=lambda p: b.medians[p] - medians[p]) if slow else None
        rows.append(RankTiming(b.rank, b.node, b.timed_steps, b.medians.get("step", 0.0) * 1e3,
                               {p: v * 1e3 for p, v in b.medians.items() if p != "step"}, own[b.rank] * 1e3,
                               ratio, slow, cause))
    lines = [f"rank {r.rank} on node {r.node}: {r.vs_baseline:.1f}x the faster ranks' own work per step "
             f"({r.own_ms:.0f} ms vs {baseline * 1e3:.0f} ms; {r.cause} {r.phases_ms[r.cause]:.0f} ms vs "
             f"{medians[r.cause] * 1e3:.0f} ms): {CAUSES[r.cause]}" for r in rows if r.slow and r.cause is not None]
    for node in sorted({r.node for r in rows}):
        on_node = [r for r in rows if r.node == node]
        if all(r.slow for r in on_node) and len(on_node) < len(rows):
            causes = sorted({r.cause for r in on_node if r.cause is not None})  # every slow rank has its cause
            lines.append(f"node {node}: every rank on it is slow ({', '.join(causes)}): check it (hpc cluster "
                         f"doctor), or drain it: scontrol update NodeName={node} State=DRAIN Reason=straggler")
    note = None if judged else (f"a rank timed {fewest} steps, fewer than the {MIN_TIMED_STEPS} a judgement needs "
                                "(run longer)")
    return Stragglers(rows, baseline * 1e3, threshold, lines, note)
