"""Data-parallel routing policies on their own: cache_aware (longest match wins, below the threshold
the least loaded, the imbalance guard overrides the match, flushes forget), round_robin and
shortest_queue."""

from __future__ import annotations

import pytest

from radixlm.managers.load_balance import (LOAD_BALANCERS, CacheAware, CacheAwareConfig, RoundRobin, ShortestQueue,
                                           create_load_balancer, least_loaded)
from radixlm.srt.server_args import LOAD_BALANCE_METHODS

PREFIX_A = list(range(100, 180))  # 80 tokens
PREFIX_B = list(range(300, 380))


def _policy(**kw) -> CacheAware:
    return CacheAware(2, CacheAwareConfig(**kw))


def test_repeated_prefix_sticks_to_its_replica():
    p = _policy()
    first = p.select(PREFIX_A + [1, 2], [0, 0])
    assert [p.select(PREFIX_A + [i, i], [0, 0]) for i in range(5)] == [first] * 5


def test_new_prefixes_spread_while_loads_are_equal():
    p = _policy()
    a = p.select(PREFIX_A + [1], [0, 0])  # both empty: replica 0 (lowest index)
    b = p.select(PREFIX_B + [1], [0, 0])  # equal loads: the smaller tree (replica 1)
    assert (a, b) == (0, 1)
    assert p.select(PREFIX_B + [2], [0, 0]) == 1 and p.select(PREFIX_A + [2], [0, 0]) == 0


def test_longest_match_wins_over_load_within_balance():
    p = _policy()
    p.record(PREFIX_A, 0)
    p.record(PREFIX_A[:40], 1)
    # replica 0 matches 80 tokens, replica 1 40; 0 is busier but not imbalanced (|10 - 0| <= 64)
    assert p.select(PREFIX_A + [5], [10, 0]) == 0


def test_below_threshold_goes_to_least_loaded():
    p = _policy(cache_threshold=0.5)
    p.record(PREFIX_A[:10] + [7] * 70, 0)
    query = PREFIX_A  # matches 10 of 80 tokens on replica 0: 0.125 <= 0.5
    assert p.select(query, [3, 1]) == 1
    p2 = _policy(cache_threshold=0.1)
    p2.record(PREFIX_A[:10] + [7] * 70, 0)
    assert p2.select(query, [3, 1]) == 0  # 0.125 > 0.1: follows the match


def test_imbalance_guard_overrides_the_match():
    def fresh() -> CacheAware:
        p = _policy(balance_abs_threshold=4, balance_rel_threshold=2.0)
        p.record(PREFIX_A, 0)
        return p

    assert fresh().select(PREFIX_A + [1], [6, 1]) == 1  # 6 - 1 > 4 and 6 > 2 * 1: imbalanced
    assert fresh().select(PREFIX_A + [1], [5, 2]) == 0  # 5 - 2 = 3: balanced, the match wins
    assert fresh().select(PREFIX_A + [1], [10, 5]) == 0  # 10 - 5 > 4 but 10 = 2 * 5: balanced
    p = fresh()
    p.select(PREFIX_A + [1], [6, 1])
    # the guard's choice is recorded: replica 1 now holds the prompt, and an equal match goes to the less loaded
    assert p.tree.match(PREFIX_A + [1]) == {0: 80, 1: 81}
    assert p.select(PREFIX_A + [2], [3, 2]) == 1


def test_flush_forgets_the_replica():
    p = _policy()
    p.record(PREFIX_A, 1)
    p.on_flush(1)
    assert p.select(PREFIX_A + [1], [0, 0]) == 0


def test_tree_size_is_bounded():
    p = _policy(max_tree_size=500)
    for i in range(200):
        p.select([i] * 30 + [i + 1] * 5, [0, 0])
    assert p.tree.size(0) <= 500 and p.tree.size(1) <= 500
    p.set_max_tree_size(100)
    replica = p.select(list(range(1000, 1040)), [0, 0])
    assert p.tree.size(replica) <= 100


def test_round_robin_alternates_regardless_of_load_and_prompt():
    p = RoundRobin(3)
    assert [p.select(PREFIX_A, [9, 0, 0]) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_shortest_queue_picks_the_fewest_unfinished():
    p = ShortestQueue(3)
    assert p.select(PREFIX_A, [2, 1, 1]) == 1
    assert p.select(PREFIX_A, [0, 1, 1]) == 0
    assert least_loaded([1, 1, 1], [5, 2, 9]) == 1


def test_registry_matches_the_flag():
    assert tuple(LOAD_BALANCERS) == LOAD_BALANCE_METHODS
    assert isinstance(create_load_balancer("cache_aware", 2), CacheAware)
    with pytest.raises(ValueError, match="unknown load balance method"):
        create_load_balancer("random", 2)
