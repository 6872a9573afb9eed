"""Every policy against its brute-force reference, and against the optimum."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken.experts.memory.slots import DEFAULT_POLICY
from freetoken.sim.policies import POLICIES, parse_policies
from freetoken.sim.replay import replay, replay_hits
import sim_reference as ref
import sim_reference_prefetch as refp
from sim_strategies import adversarial_streams, layer_ordered_streams, streams

REFERENCES = {
    "lru": ref.ref_lru,
    "per-layer-lru": ref.ref_per_layer_lru,
    "lfu": ref.ref_lfu,
    "arc": ref.ref_arc,
    "static-split": ref.ref_static,
    "hot-placement": ref.ref_hot,
    "lrfu": ref.ref_lrfu,
    "lfu+admit": lambda stream, slots: ref.ref_lfu(stream, slots, admit=True),
    "lrfu+admit": lambda stream, slots: ref.ref_lrfu(stream, slots, admit=True),
    "arc+admit": lambda stream, slots: ref.ref_arc(stream, slots, admit=True),
    "lru+prefetch": lambda stream, slots: refp.ref_prefetch(stream, slots, "lru"),
    "lrfu+admit+prefetch": lambda stream, slots: refp.ref_prefetch(stream, slots, "lrfu", admit=True),
}
if DEFAULT_POLICY in REFERENCES:     # the '+layer' default: checked against an exhaustive Belady
    REFERENCES["default"] = REFERENCES[DEFAULT_POLICY]      # (tests/experts/test_layer_aware.py)
# load an entry only when it is routed (no prefetch, no placement ahead of use): belady-on-use's class
ON_USE = ("lru", "per-layer-lru", "lfu", "arc", "lrfu", "lfu+admit", "lrfu+admit", "arc+admit")


def hits(name, stream, slots):
    return replay_hits(POLICIES[name](slots, stream.num_layers, stream.num_experts), stream)


def decode_misses(name, stream, slots):
    return replay(name, stream, slots).misses


@pytest.mark.parametrize("name", sorted(REFERENCES))
@settings(max_examples=50, deadline=None)
@given(stream=streams(), slots=st.integers(0, 7))
def test_policy_matches_reference_on_random_streams(name, stream, slots):
    assert hits(name, stream, slots) == REFERENCES[name](stream, slots)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_policy_matches_reference_on_adversarial_streams(name):
    for stream in adversarial_streams():
        for slots in range(0, stream.universe + 2):
            assert hits(name, stream, slots) == REFERENCES[name](stream, slots), (stream, slots)


@settings(max_examples=100, deadline=None)
@given(stream=streams(max_layers=2, max_experts=3, max_cells=8), slots=st.integers(0, 3))
def test_belady_equals_exhaustive_optimum(stream, slots):
    assert decode_misses("belady", stream, slots) == ref.optimal_decode_misses(stream, slots)


def test_belady_equals_exhaustive_optimum_on_adversarial_streams():
    for stream in adversarial_streams():
        for slots in range(0, 4):
            assert decode_misses("belady", stream, slots) == ref.optimal_decode_misses(stream, slots)


@settings(max_examples=80, deadline=None)
@given(stream=streams(), slots=st.integers(0, 7))
def test_no_policy_beats_belady(stream, slots):
    # a prefetching policy may (it loads entries ahead of use, at the price of a transfer each)
    bound = decode_misses("belady", stream, slots)
    for name in POLICIES:
        if "prefetch" not in name:
            assert decode_misses(name, stream, slots) >= bound, name


@settings(max_examples=100, deadline=None)
@given(stream=streams(max_layers=2, max_experts=3, max_cells=7), slots=st.integers(0, 3))
def test_belady_on_use_equals_exhaustive_optimum(stream, slots):
    assert decode_misses("belady-on-use", stream, slots) == ref.optimal_on_use_misses(stream, slots)


def test_belady_on_use_equals_exhaustive_optimum_on_adversarial_streams():
    for stream in adversarial_streams():
        if len(ref.accesses(stream)) <= 40:
            for slots in range(0, 3):
                assert decode_misses("belady-on-use", stream, slots) == ref.optimal_on_use_misses(stream, slots)


@settings(max_examples=80, deadline=None)
@given(stream=streams(), slots=st.integers(0, 7))
def test_no_fetch_on_use_policy_beats_belady_on_use(stream, slots):
    bound = decode_misses("belady-on-use", stream, slots)
    assert bound >= decode_misses("belady", stream, slots)
    for name in ON_USE:
        assert decode_misses(name, stream, slots) >= bound, name


@settings(max_examples=60, deadline=None)
@given(stream=layer_ordered_streams(), slots=st.integers(0, 9))
def test_prefetching_policies_match_reference_on_layer_ordered_streams(stream, slots):
    for name in ("lru+prefetch", "lrfu+admit+prefetch"):
        assert hits(name, stream, slots) == REFERENCES[name](stream, slots), name


def test_static_placement_beats_demand_paging_belady_so_the_bound_allows_bypass():
    # one slot, decode A B A B: keeping A costs 2 misses; any always-admit policy pays 3+
    from freetoken.sim.access import stream_from_keys

    stream = stream_from_keys(1, 2, [("decode", [[1], [0], [1], [0]])])
    assert decode_misses("static-split", stream, 1) == 2
    assert decode_misses("lru", stream, 1) == 4
    assert decode_misses("belady", stream, 1) == 2


def test_lru_misses_everything_on_a_loop_one_larger_than_the_cache():
    from sim_strategies import cyclic_stream

    stream = cyclic_stream(5, 4)
    assert decode_misses("lru", stream, 4) == 20
    assert decode_misses("belady", stream, 4) < 20


@settings(max_examples=40, deadline=None)
@given(stream=streams())
def test_lru_and_belady_never_miss_more_with_more_slots(stream):
    for name in ("lru", "belady"):
        misses = [decode_misses(name, stream, s) for s in range(0, stream.universe + 1)]
        assert misses == sorted(misses, reverse=True), name


def test_full_capacity_after_a_prefill_has_only_compulsory_misses():
    from freetoken.sim.access import stream_from_keys

    stream = stream_from_keys(2, 2, [("prefill", [[0, 1], [2, 3]]), ("decode", [[0], [3], [1], [2]] * 2)])
    for name in ("lru", "per-layer-lru", "lfu", "arc", "hot-placement", "static-split", "belady"):
        assert decode_misses(name, stream, 4) == 0, name


def test_parse_policies():
    assert parse_policies("all") == list(POLICIES)
    assert parse_policies("lru, arc") == ["lru", "arc"]
    with pytest.raises(ValueError, match="unknown policy .nope."):
        parse_policies("lru,nope")


def test_lrfu_scores_decay_by_half_each_half_life():
    import numpy as np

    from freetoken.experts.memory.slots import HALF_LIFE_TOKENS, SlotTable

    t = SlotTable(4, 2, 4, "lrfu")
    t.record(np.array([0]))  # token 0, layer 0
    t.record(np.array([2]))  # layer 1
    for _ in range(int(HALF_LIFE_TOKENS)):  # each pass back to layer 0 is a new token
        t.record(np.array([1]))
        t.record(np.array([3]))
    assert t.since[0] == 0 and t.count[0] == 1.0
    p0, p1 = t.score(np.array([0, 1]))
    assert math.isclose(p0 - p1, math.log(0.5) - math.log(sum(0.5 ** (i / HALF_LIFE_TOKENS) for i in range(32))), rel_tol=1e-9)


def test_lrfu_prefers_frequent_entries_that_lru_would_drop():
    from sim_strategies import stream_from_keys

    # entry 0 is used every token; a burst of one-off entries would flush it from an LRU of 3
    cells = [[0], [1], [2], [3], [0], [4], [5], [6], [0]]
    stream = stream_from_keys(1, 7, [("decode", cells)])
    assert decode_misses("lru", stream, 3) == 9
    assert decode_misses("lrfu", stream, 3) == 8


def _demand_paging_optimum(keys, slots):
    """Fewest misses over every eviction choice when every miss must be admitted."""
    from functools import lru_cache

    @lru_cache(None)
    def best(i, state):
        if i == len(keys):
            return 0
        k = keys[i]
        if k in state:
            return best(i + 1, state)
        if len(state) < slots:
            return 1 + best(i + 1, state | {k})
        if slots == 0:
            return 1 + best(i + 1, state)
        return 1 + min(best(i + 1, (state - {y}) | {k}) for y in state)

    return best(0, frozenset())


@settings(max_examples=100, deadline=None)
@given(keys=st.lists(st.integers(0, 4), min_size=1, max_size=10), slots=st.integers(0, 3))
def test_belady_no_bypass_equals_exhaustive_demand_paging_optimum(keys, slots):
    from freetoken.sim.access import stream_from_keys

    stream = stream_from_keys(1, 5, [("decode", [[k] for k in keys])])
    assert decode_misses("belady-no-bypass", stream, slots) == _demand_paging_optimum(tuple(keys), slots)


def test_static_oracle_pins_the_most_used_decode_entries():
    from freetoken.sim.access import stream_from_keys

    stream = stream_from_keys(1, 3, [("prefill", [[0, 1, 2]]), ("decode", [[2], [1], [2], [0], [2], [1]])])
    assert [h for _, h in hits("static-oracle", stream, 1)] == [False, False, True] + [True, False, True, False, True, False]
    assert decode_misses("static-oracle", stream, 2) == 1
