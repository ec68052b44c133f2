"""The bad-node search's rounds (toolkit.health.nodesearch.search) against a stand-in cluster: a function giving
each group's all_reduce bus bandwidth from its nodes' speeds (the slowest node paces a ring) with noise, or a
failure where a node fails. On the local Slurm, with nodes made bad for real: tests/test_nodesearch_slurm.py."""

from __future__ import annotations

import math
import random

import pytest

from toolkit.health.nodesearch import GroupRun, drain_commands, first_groups, max_rounds, search


def standin(slow: dict[str, float] | None = None, failing: set[str] | frozenset[str] = frozenset(),
            noise: float = 0.1, seed: int = 0, once: dict[int, set[str]] | None = None):
    """measure(round, groups): busbw 10 GB/s x the slowest member's speed x (1 +- noise); a group with a failing
    node fails; `once`: nodes slow (x0.2) in that round only (a transient, e.g. a noisy neighbour)."""
    rng = random.Random(seed)
    slow = slow or {}
    calls = []

    def measure(number, groups):
        calls.append([tuple(g) for g in groups])
        runs = []
        for g in groups:
            if failing & set(g):
                runs.append(GroupRun(tuple(g), None, "the collective failed: Connection reset by peer"))
                continue
            speed = min(slow.get(n, 1.0) * (0.2 if n in (once or {}).get(number, ()) else 1.0) for n in g)
            runs.append(GroupRun(tuple(g), 10 * speed * (1 + rng.uniform(-noise, noise))))
        return runs
    measure.calls = calls
    return measure


def names(n: int) -> list[str]:
    return [f"n{i:02d}" for i in range(1, n + 1)]


@pytest.mark.parametrize("n", [8, 16])
@pytest.mark.parametrize("group_size", [2, 0])  # 0: plain bisection (halves first)
def test_one_slow_node_is_found_within_the_round_goal_at_every_position(n, group_size):
    for bad in names(n):
        measure = standin({bad: 0.3}, seed=hash(bad) % 1000)
        result = search(names(n), measure, group_size or n // 2)
        assert set(result.bad) == {bad} and not result.unresolved, (bad, result.rounds)
        assert len(result.rounds) <= math.ceil(math.log2(n)) + 2 == max_rounds(n)
        assert "bus bandwidth" in result.bad[bad] and result.per_node[bad]["verdict"] == "bad"
        assert len(measure.calls[0]) == (n // 2 if group_size == 2 else 2)
        for groups in measure.calls:  # a node runs in at most one group at a time
            members = [x for g in groups for x in g]
            assert len(members) == len(set(members))


def test_pairs_take_three_rounds_and_far_fewer_runs_than_all_pairs():
    measure = standin({"n05": 0.3})
    result = search(names(16), measure)
    assert len(result.rounds) == 3  # pairs, the slow pair split (each with a healthy partner), the confirmation
    assert sum(len(c) for c in measure.calls) < math.comb(16, 2) / 5


def test_two_bad_nodes_and_a_failing_one_are_all_named():
    result = search(names(16), standin({"n03": 0.2, "n12": 0.4}, failing={"n07"}))
    assert set(result.bad) == {"n03", "n07", "n12"}
    assert result.bad["n07"] == "the collective failed: Connection reset by peer"
    assert len(result.rounds) <= max_rounds(16)


def test_clean_clusters_raise_no_false_alarm_over_twenty_noisy_searches():
    for seed in range(20):
        assert search(names(16), standin(noise=0.25, seed=seed)).bad == {}


def test_a_transient_slow_run_is_cleared_by_the_confirmation_round():
    """n04 looks slow in rounds 1 and 2 only (a noisy neighbour): the confirmation round clears it."""
    result = search(names(8), standin(once={1: {"n04"}, 2: {"n04"}}))
    assert result.bad == {} and len(result.rounds) == 3
    assert result.per_node["n04"]["verdict"] == "ok"


def test_two_nodes_that_fail_together_cannot_be_told_apart():
    result = search(["a", "b"], standin(failing={"b"}))
    assert result.bad == {} and result.unresolved == ["a", "b"]


def test_groups_and_the_drain_plan():
    assert first_groups(names(5), 2) == [("n01", "n02"), ("n03", "n04", "n05")]  # no group of one
    assert first_groups(names(8), 8) == [tuple(names(4)), tuple(names(8)[4:])]  # two groups at least
    plan = drain_commands({"n03": "all_reduce bus bandwidth 2 GB/s with n01, against 10 GB/s"})
    assert plan == [["scontrol", "update", "NodeName=n03", "State=DRAIN",
                     "Reason=hpc find-bad-nodes: all_reduce bus bandwidth 2 GB/s with n01, against 10 GB/s"]]


def test_noise_in_the_first_round_leaves_few_healthy_partners_and_the_suspects_wait_their_turn():
    """Three of four pairs look slow in round 1 (n01 and n03 by noise, n06 for real): two healthy partners for six
    suspects, so four wait a round; the search still names n06 alone within the goal."""
    measure = standin({"n06": 0.3}, once={1: {"n01", "n03"}})
    result = search(names(8), measure)
    assert result.bad.keys() == {"n06"} and not result.unresolved
    assert len(result.rounds) == 4 <= max_rounds(8)
    # round 2: two partners free; round 4: the confirmation and a control group of healthy nodes
    assert [len(c) for c in measure.calls] == [4, 2, 4, 2]
