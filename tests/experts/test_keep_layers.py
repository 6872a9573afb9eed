"""`SlotTable.keep`: the kept layers' residents are the last victims while the slots hold a step's
working set and those layers whole, and the policy's own order otherwise (the disk tier keeps
layer 0, backend.KEEP_FIRST). Random tables of random accesses, checked against the order the
same table gives without the kept layers (the victims other than the kept ones, in that order,
then the kept ones, in that order) and against a brute-force count of what may be kept."""
from __future__ import annotations

import copy

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken.experts.memory.slots import SlotTable


def _twins(L: int, E: int, slots: int, policy: str, calls: list[list[int]], seed: int):
    """A table after the accesses (`serve`, one layer call each, layers in order) with a few
    slots locked, and its copy keeping layer 0 (the same state: only the victims' order differs)."""
    b = SlotTable(L * E, E, slots, policy)
    for ids in calls:
        b.serve(np.asarray(ids, np.int64))
    rng = np.random.default_rng(seed)
    b.lock(rng.choice(slots, size=rng.integers(0, max(1, slots // 4)), replace=False))
    b.check()
    a = copy.deepcopy(b)
    a.keep((0,))
    return a, b


@st.composite
def tables(draw):
    L, E = draw(st.integers(2, 4)), draw(st.integers(2, 6))
    k = draw(st.integers(1, E))
    slots = draw(st.integers(1, L * E))
    passes = draw(st.integers(1, 6))
    calls = []
    for _ in range(passes):
        for layer in range(L):
            ids = draw(st.lists(st.integers(0, E - 1), min_size=1, max_size=k, unique=True))
            calls.append(sorted(layer * E + i for i in ids))
    return L, E, slots, draw(st.sampled_from(["lru", "lfu", "lrfu", "lrfu+layer"])), calls, draw(st.integers(0, 99))


@settings(max_examples=300, deadline=None)
@given(tables(), st.integers(1, 24))
def test_kept_layer_goes_last_exactly_when_it_fits(case, k):
    L, E, slots, policy, calls, seed = case
    kept, plain = _twins(L, E, slots, policy, calls, seed)
    got, ref = kept.candidates(k), plain.candidates(plain.capacity)
    ws = max(plain.working_set, plain._pass_count)
    fits = slots >= ws + E and not (plain.layer_aware and ws > slots)
    if not fits:
        assert got.tolist() == ref[:k].tolist()
        return
    is_kept = (plain.owner[ref] >= 0) & (plain.owner[ref] < E)
    assert got.tolist() == np.concatenate([ref[~is_kept], ref[is_kept]])[:k].tolist()


@settings(max_examples=200, deadline=None)
@given(tables())
def test_a_kept_resident_is_evicted_only_when_nothing_else_frees(case):
    """Serving more passes: whenever a layer-0 resident of the keeping table is evicted, every
    other slot was locked or pending (or the working set stopped fitting)."""
    L, E, slots, policy, calls, seed = case
    t = SlotTable(L * E, E, slots, policy)
    t.keep((0,))
    for ids in calls * 2:
        ids = np.asarray(ids, np.int64)
        before = t.owner.copy()
        hit_slots = set(t.slot_of[ids][t.slot_of[ids] >= 0].tolist())
        free_other = sum(1 for s in range(slots) if not (0 <= before[s] < E) and s not in hit_slots)
        t.serve(ids)
        t.check()
        ws = max(t.working_set, t._pass_count)          # (what the victims were chosen under)
        fits = t.capacity >= ws + E and not (t.layer_aware and ws > t.capacity)
        lost = [f for f in before[(before >= 0) & (before < E)].tolist() if t.slot_of[f] < 0]
        if lost and fits:
            assert len(ids) - len(hit_slots) > free_other
