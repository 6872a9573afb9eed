"""The slot table's first victims (`SlotTable.candidates`, a few of a large table): numpy and each C
build (kernels/c/slot_victims.c) against a brute-force sort of the free slots by the documented keys,
on drawn tables (policies, layer order, kept layers, locks, pending reads, empty slots)."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken import kernels
from freetoken.experts.memory.slots import SlotTable

# every way the victims are found: numpy (None) and each C build
BUILDS = [None, *kernels.variants_here()]
L, E = 6, 8


def brute_force(t: SlotTable, k: int, ordered: bool, keeps: bool) -> list[int]:
    """The free slots sorted by (empty first by slot; then not kept before kept; furthest next use
    first where ordered; least score; least recently used), the first k. The score recomputed here
    from the counts (lrfu: log(count) + rate x the token of the last access)."""
    def score(f):
        if t.policy == "lfu":
            return float(t.count[f])
        if t.policy == "lrfu":
            return (math.log(t.count[f]) if t.count[f] > 0 else -math.inf) + t.rate * int(t.since[f])
        return 0.0

    def next_use(f):
        d = (f // E - t._cur_layer) % L
        return d or L
    free = [s for s in range(t.capacity) if t.locks[s] == 0 and not t.pending[s]]
    empty = [s for s in free if t.owner[s] < 0]
    used = [s for s in free if t.owner[s] >= 0]
    kept = {s for s in used if keeps and int(t.owner[s]) // E in t.keep_layers}
    used.sort(key=lambda s: (s in kept, -next_use(int(t.owner[s])) if ordered else 0, score(int(t.owner[s])),
                             int(t.stamp[s]), s))
    return (empty + used)[:k]


@st.composite
def tables(draw):
    policy = draw(st.sampled_from(["lru", "lfu", "lrfu", "lru+layer", "lfu+layer", "lrfu+layer"]))
    capacity = draw(st.integers(16, 40))
    t = SlotTable(L * E, E, capacity, policy)
    t.build = None
    if draw(st.booleans()):
        t.keep((0,))
    for layer in draw(st.lists(st.integers(0, L - 1), min_size=1, max_size=30)):
        t.serve(np.array(sorted(draw(st.sets(st.integers(0, E - 1), min_size=1, max_size=4)))) + layer * E)
    for s in draw(st.lists(st.integers(0, capacity - 1), max_size=6)):
        t.locks[s] += 1
    for s in draw(st.lists(st.integers(0, capacity - 1), max_size=4)):
        t.pending[s] = True
    for s in draw(st.lists(st.integers(0, capacity - 1), max_size=4)):   # emptied (a failed read's drop)
        if t.owner[s] >= 0:
            t.slot_of[t.owner[s]], t.owner[s], t.stamp[s] = -1, -1, -1
    if draw(st.booleans()):             # a step that does not fit: next-use order
        t._pass_count = capacity + 1
    return t


@pytest.mark.parametrize("build", BUILDS)
@settings(max_examples=200, deadline=None)
@given(t=tables(), k=st.integers(1, 4))
def test_victims_match_a_brute_force_sort(build, t, k):
    t.build = build
    k = min(k, t.capacity // 8 - 1)
    ordered = t.layer_aware and max(t.working_set, t._pass_count) > t.capacity
    keeps = bool(t.keep_layers) and not ordered and \
        t.capacity >= max(t.working_set, t._pass_count) + len(t.keep_layers) * E
    assert t.candidates(k).tolist() == brute_force(t, k, ordered, keeps)


@pytest.mark.parametrize("build", kernels.variants_here())
@settings(max_examples=100, deadline=None)
@given(t=tables(), k=st.integers(1, 4))
def test_c_victims_equal_numpy(build, t, k):
    k = min(k, t.capacity // 8 - 1)
    want = t.candidates(k)
    t.build = build
    assert t.candidates(k).tolist() == want.tolist()


def test_the_c_victims_follow_a_resize():
    """The C call's cached addresses follow the table's arrays when a resize replaces them."""
    t = SlotTable(L * E, E, 40, "lrfu+layer")
    t.build = "native"
    for layer in range(L):
        t.serve(np.arange(3) + layer * E)
    first = t.candidates(2)
    t.keep_best(24)
    assert t.candidates(2).tolist() == [18, 19]       # the freed slots, emptied by the rebuild
    assert len(first) == 2 and t.capacity == 24


def test_the_lrfu_score_kept_is_the_recomputed_one():
    t = SlotTable(L * E, E, 16, "lrfu")
    rng = np.random.default_rng(0)
    for _ in range(40):
        layer = int(rng.integers(0, L))
        t.serve(np.unique(rng.integers(0, E, 3)) + layer * E)
    ids = np.arange(L * E)
    with np.errstate(divide="ignore"):
        assert np.array_equal(t.score(ids), np.log(t.count[ids]) + t.rate * t.since[ids])
