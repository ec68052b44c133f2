"""Straggling ranks and nodes, from the per-rank step times the ranks' heartbeats keep (toolkit.node.heartbeat).

In a data-parallel job every rank's step takes as long as the slowest rank's: the others wait for it in the
gradient all-reduce. So a straggler is found by the work no collective holds back, a rank's own work per step:
its data wait plus its forward pass (our ResNet trainer times both). The baseline is the lower quartile of the
ranks' own work, what the faster ranks take: a median would sit between the healthy and the slow ranks when a
slow node holds a large share of them (half, on 2 nodes).

The verdict is a test of significance across the run's own step windows, not one ratio. A fixed ratio of whole-
run medians fired on 2 of 7 clean runs here (a healthy rank at 1.56x and 1.58x against +50%: a shared machine
slows one rank for a stretch of a short run, and the median goes with it). A node that is slow for real is slow
in every stretch. So the ranks' last steps, lined up by step number, are cut into windows (WINDOWS_WANTED of
them, at least one step each); in each window each rank's own work (its median over the window's steps) is
compared with that window's baseline (the lower quartile across ranks), and the rank "exceeds" it there when
it is more than `threshold` above. A rank is a straggler when it exceeds in so many windows that a one-sided
sign test rejects "its own work is at most threshold above the baseline in the median window" (under that null
hypothesis each window exceeds with probability at most 1/2, so the count is at most Binomial(n, 1/2): the sign
test, e.g. Conover, Practical Nonparametric Statistics, 3rd ed., section 3.4), at a family-wise level `alpha`
over the ranks (Bonferroni: each rank at alpha / ranks). Windows rather than single steps because one slow
stretch spans consecutive steps; the test asks for independent trials, and windows come closer. The threshold
says how much slower matters (+30%), the test how sure the run is of it: 11 timed steps in 4 ranks need 10
windows of 11 over the line (p = 0.006 < 0.05 / 4), 200 steps 17 of 22.

The likely cause is the phase that grew most over the ranks' median for it (data: its loading, the storage or
too few loader workers; compute: a slow or throttled device or CPU). A node all of whose ranks are flagged is
named as the node to look at. Nothing is judged from fewer than MIN_TIMED_STEPS steps the ranks share, nor where
ranks passed no phase times (a script calling beat(step) alone), nor from heartbeats that keep no per-step times
(an older hpc's): the report says why.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Sequence

from toolkit.node.heartbeat import Beat

OWN_WORK = ("data", "compute")  # the phases no collective holds back
DEFAULT_THRESHOLD = 0.3  # a window's own work above its baseline (the lower quartile of own work) by this fraction
DEFAULT_ALPHA = 0.05  # the sign test's family-wise level over the job's ranks
MIN_TIMED_STEPS = 10
WINDOWS_WANTED = 20  # windows the shared steps are cut into (fewer, of one step each, when fewer steps)


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
    windows_over: int = 0  # windows in which its own work was above the window's baseline by the threshold
    windows: int = 0  # windows judged (0: not judged)
    p_value: float | None = None  # the sign test's: P(Binomial(windows, 1/2) >= windows_over)


@dataclasses.dataclass(frozen=True)
class Stragglers:
    ranks: list[RankTiming]
    baseline_own_ms: float | None  # the lower quartile of the ranks' own work
    threshold: float
    lines: list[str]  # one per slow rank, then one per node all of whose ranks are slow
    note: str | None = None  # why no judgement could be made
    alpha: float = DEFAULT_ALPHA
    window_steps: int | None = None  # steps per window (None: not judged)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


CAUSES = {"data": "its data loading is slow (the storage, or too few loader workers for the node's CPUs)",
          "compute": "its compute is slow (a throttled or faulty GPU, or a CPU shared with other work)"}


def sign_test_p(over: int, windows: int) -> float:
    """One-sided sign test: P(X >= over) for X ~ Binomial(windows, 1/2)."""
    return sum(math.comb(windows, k) for k in range(over, windows + 1)) / 2 ** windows


def own_work_by_step(beat: Beat) -> dict[int, float]:
    """A rank's own work (data + compute) in each step its heartbeat kept, by step number."""
    data, compute = (beat.recent.get(p) or [] for p in OWN_WORK)
    if not len(data) == len(compute) == len(beat.recent_steps):
        return {}
    return {step: d + c for step, d, c in zip(beat.recent_steps, data, compute, strict=True)
            if d is not None and c is not None}


def windows_over(by_rank: dict[int, dict[int, float]], threshold: float) -> tuple[dict[int, int], int, int]:
    """Per rank, how many of the shared steps' windows its own work exceeds the window's baseline by more than
    `threshold`; the number of windows; the steps per window."""
    shared = sorted(set.intersection(*(set(steps) for steps in by_rank.values())))
    size = max(1, len(shared) // WINDOWS_WANTED)
    windows = [shared[i:i + size] for i in range(0, len(shared) - size + 1, size)]
    over = dict.fromkeys(by_rank, 0)
    for window in windows:
        own = {rank: statistics.median(steps[s] for s in window) for rank, steps in by_rank.items()}
        baseline = statistics.quantiles(own.values(), n=4, method="inclusive")[0]
        for rank, seconds in own.items():
            over[rank] += seconds > (1 + threshold) * baseline
    return over, len(windows), size


def find_stragglers(beats: Sequence[Beat], threshold: float = DEFAULT_THRESHOLD,
                    alpha: float = DEFAULT_ALPHA) -> Stragglers:
    """Flag the ranks whose own work per step is more than `threshold` above the baseline in significantly many
    of the run's windows (the module's docstring says how)."""
    timed = [b for b in beats if b.timed_steps and all(p in b.medians for p in OWN_WORK)]
    if len(timed) < 2:
        why = ("fewer than 2 ranks timed their steps' phases (data, compute): beat(step) alone gives only step "
               "times, which are equal on every rank of a synchronous job") if beats else "no heartbeats"
        return Stragglers([], None, threshold, [], why, alpha)
    own = {b.rank: sum(b.medians[p] for p in OWN_WORK) for b in timed}
    baseline = statistics.quantiles(own.values(), n=4, method="inclusive")[0]
    medians = {p: statistics.median(b.medians[p] for b in timed) for p in OWN_WORK}
    by_rank = {b.rank: own_work_by_step(b) for b in timed}
    over, windows, size = windows_over(by_rank, threshold)
    shared = windows * size
    note = None
    if not all(by_rank.values()):
        note = "the heartbeats keep no per-step times (written by an older hpc): run again to judge"
    elif shared < MIN_TIMED_STEPS:
        note = (f"the ranks share {shared} timed steps, fewer than the {MIN_TIMED_STEPS} a judgement needs "
                "(run longer)")
    rows = []
    for b in timed:
        ratio = own[b.rank] / baseline if baseline > 0 else 1.0
        p_value = None if note else sign_test_p(over[b.rank], windows)
        slow = p_value is not None and p_value < alpha / len(timed)
        cause = max(OWN_WORK, key=lambda p: b.medians[p] - medians[p]) if slow else None
        rows.append(RankTiming(b.rank, b.node, b.timed_steps, b.medians.get("step", 0.0) * 1e3,
                               {p: v * 1e3 for p, v in b.medians.items() if p != "step"}, own[b.rank] * 1e3,
                               ratio, slow, cause, 0 if note else over[b.rank], 0 if note else windows, p_value))
    lines = [f"rank {r.rank} on node {r.node}: {r.vs_baseline:.1f}x the faster ranks' own work per step "
             f"({r.own_ms:.0f} ms vs {baseline * 1e3:.0f} ms; over them by more than {threshold:.0%} in "
             f"{r.windows_over} of {r.windows} windows, p = {r.p_value:.2g}; {r.cause} {r.phases_ms[r.cause]:.0f} "
             f"ms vs {medians[r.cause] * 1e3:.0f} ms): {CAUSES[r.cause]}"
             for r in rows if r.slow and r.cause is not None and r.p_value is not None]
    for node in sorted({r.node for r in rows}):
        on_node = [r for r in rows if r.node == node]
        if all(r.slow for r in on_node) and len(on_node) < len(rows):
            causes = sorted({r.cause for r in on_node if r.cause is not None})  # every slow rank has its cause
            lines.append(f"node {node}: every rank on it is slow ({', '.join(causes)}): check it (hpc cluster "
                         f"doctor), or drain it: scontrol update NodeName={node} State=DRAIN Reason=straggler")
    return Stragglers(rows, baseline * 1e3, threshold, lines, note, alpha, None if note else size)
