"""Stragglers from the ranks' step times (toolkit.reports.stragglers): made-up heartbeats here; a node made slow
for real on the local Slurm in tests/test_stragglers_slurm.py."""

from __future__ import annotations

import statistics

import pytest

from toolkit.reports.stragglers import find_stragglers
from toolkit.node.heartbeat import Beat


def beat(rank: int, data: float, compute: float, sync: float, node: str | None = None, steps: int = 49) -> Beat:
    # Under DDP every rank's step takes as long as the slowest one's: sync absorbs the difference.
    return Beat(rank, node or f"n{rank // 2 + 1}", 100 + rank, 50, 0.0, 0.0, 10.0, steps,
                {"step": data + compute + sync, "data": data, "compute": compute, "sync": sync})


def test_a_node_slow_in_compute_is_flagged_with_its_ranks_and_the_others_are_not():
    # Half the ranks are slow (one node of two): the baseline is the faster ranks' (lower quartile), not a median
    # between the two groups.
    found = find_stragglers([beat(0, 0.01, 0.10, 0.20), beat(1, 0.01, 0.11, 0.19),
                             beat(2, 0.01, 0.19, 0.01), beat(3, 0.01, 0.20, 0.0)])
    assert found.baseline_own_ms == pytest.approx(117.5)
    assert [(r.rank, r.slow, r.cause) for r in found.ranks] == [(0, False, None), (1, False, None),
                                                                  (2, True, "compute"), (3, True, "compute")]
    assert found.lines[0].startswith("rank 2 on node n2: 1.7x the faster ranks' own work per step")
    assert "its compute is slow" in found.lines[0]
    assert found.lines[-1].startswith("node n2: every rank on it is slow (compute)")
    assert "scontrol update NodeName=n2 State=DRAIN" in found.lines[-1]


def test_a_rank_waiting_for_its_data_is_flagged_for_its_data_loading_alone():
    found = find_stragglers([beat(r, 0.30 if r == 5 else 0.01, 0.1, 0.0, node="n1") for r in range(8)])
    assert [r.rank for r in found.ranks if r.slow] == [5] and found.ranks[5].cause == "data"
    assert len(found.lines) == 1 and "data loading" in found.lines[0]  # n1 has fast ranks too: no node line


def test_ranks_within_the_threshold_are_not_flagged():
    found = find_stragglers([beat(r, 0.01, 0.10 * (1 + 0.03 * r), 0.05) for r in range(6)], threshold=0.2)
    assert not any(r.slow for r in found.ranks) and found.lines == []
    assert found.baseline_own_ms == pytest.approx(
        statistics.quantiles([r.own_ms for r in found.ranks], n=4, method="inclusive")[0])


def test_a_few_steps_are_shown_but_not_judged():
    # Medians of 5 steps on a shared machine differ by 40% between healthy ranks (seen here): no verdict.
    found = find_stragglers([beat(r, 0.01, 0.30 if r == 1 else 0.1, 0.0, steps=5) for r in range(4)])
    assert len(found.ranks) == 4 and not any(r.slow for r in found.ranks) and found.lines == []
    assert "fewer than the 10 a judgement needs" in found.note


def test_step_times_alone_cannot_tell_the_ranks_apart_and_say_so():
    plain = [Beat(r, "n1", r, 9, 0.0, 0.0, 10.0, 8, {"step": 0.2}) for r in range(4)]
    found = find_stragglers(plain)
    assert found.ranks == [] and found.lines == [] and "beat(step) alone" in found.note
