"""Layer-aware eviction ('+layer', experts/memory/slots.py) against a brute-force Belady.

A layer-cyclic trace: every token passes the layers in order and routes the same experts at
each layer. Each layer call needs all its experts resident at once (the engine locks them),
so the offline optimum is found by trying every choice of victims at every call (an
exhaustive search, no rule assumed). The slot table, driven as the host cache drives it
(record, lock the hits, victims for the misses, unlock), must miss exactly as often as that
optimum, with whatever base policy; and the sim replays the same table one key at a time
with the same counts (sim and engine: one code path)."""
from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken.experts.memory.slots import SlotTable
from freetoken.sim.access import AccessStream, Segment
from freetoken.sim.replay import replay
from freetoken.sim.trace import DECODE


def table_misses(calls: list[list[int]], L: int, E: int, slots: int, policy: str) -> int:
    """The engine's use of the table for each layer call (host_cache.acquire_nowait's steps)."""
    t = SlotTable(L * E, E, slots, policy)
    misses = 0
    for ids in calls:
        ids = np.asarray(ids, np.int64)
        t.record(ids)
        s = t.slot_of[ids]
        hit = s >= 0
        t.lock(s[hit])
        t.touch(s[hit])
        miss = ids[~hit]
        misses += len(miss)
        victims = t.candidates(len(miss), miss)
        assert len(victims) == len(miss)
        t.assign(miss, victims)
        t.ready(victims)
        t.unlock(np.concatenate([s[hit], victims]))
        t.check()
    return misses


def optimum_misses(calls: list[list[int]], slots: int) -> int:
    """Fewest misses over every choice of victims (demand fetch: a call's misses must be
    loaded; any resident not in the call may go)."""
    calls_t = tuple(tuple(c) for c in calls)

    @lru_cache(maxsize=None)
    def best(i: int, resident: frozenset) -> int:
        if i == len(calls_t):
            return 0
        need = frozenset(calls_t[i])
        miss = need - resident
        free = slots - len(resident)
        evict = max(0, len(miss) - free)
        others = sorted(resident - need)
        return len(miss) + min(best(i + 1, (resident - frozenset(gone)) | need)
                               for gone in itertools.combinations(others, evict))

    return best(0, frozenset())


@st.composite
def cyclic(draw):
    L = draw(st.integers(2, 4))
    E = draw(st.integers(2, 4))
    sets = [sorted(draw(st.lists(st.integers(0, E - 1), min_size=1, max_size=min(E, 3), unique=True)))
            for _ in range(L)]
    tokens = draw(st.integers(2, 4))
    width = max(len(s) for s in sets)
    W = sum(len(s) for s in sets)
    slots = draw(st.integers(width, W + 1))
    calls = [[layer * E + e for e in sets[layer]] for _ in range(tokens) for layer in range(L)]
    return L, E, slots, calls


@settings(max_examples=120, deadline=None)
@given(cyclic(), st.sampled_from(["lru+layer", "lfu+layer", "lrfu+layer"]))
def test_layer_aware_is_belady_on_layer_cyclic_traces(case, policy):
    L, E, slots, calls = case
    assert table_misses(calls, L, E, slots, policy) == optimum_misses(calls, slots)


@settings(max_examples=60, deadline=None)
@given(cyclic(), st.sampled_from(["lru", "lrfu"]))
def test_the_policies_without_it_are_never_better(case, policy):
    L, E, slots, calls = case
    assert table_misses(calls, L, E, slots, policy) >= optimum_misses(calls, slots)


def test_the_failure_it_fixes():
    """4 layers routing 2 experts each, 6 slots: LRU evicts the layer needed next and misses
    every routed expert; the layer-aware table misses only what does not fit."""
    L, E = 4, 8
    calls = [[layer * E + 1, layer * E + 5] for _ in range(6) for layer in range(L)]
    assert table_misses(calls, L, E, 6, "lru") == len(calls) * 2
    assert table_misses(calls, L, E, 6, "lrfu") == len(calls) * 2
    best = optimum_misses(calls, 6)
    assert table_misses(calls, L, E, 6, "lru+layer") == best < len(calls) * 2


def _stream(calls: list[list[int]], L: int, E: int) -> AccessStream:
    seg = Segment(DECODE, tuple(tuple(c) for c in calls), tuple(c[0] // E for c in calls))
    return AccessStream(L, E, (seg,))


@settings(max_examples=60, deadline=None)
@given(cyclic(), st.sampled_from(["lru+layer", "lrfu+layer", "lfu+layer"]))
def test_sim_replays_the_engine_table(case, policy):
    """`freetoken sim` feeds the same table one key at a time (the cell's keys locked until the
    cell ends): the same misses as the engine's layer calls."""
    L, E, slots, calls = case
    res = replay(policy, _stream(calls, L, E), slots)
    assert res.misses == table_misses(calls, L, E, slots, policy)
