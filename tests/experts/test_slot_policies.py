"""Every `expert_cache_policy` of the `SlotTable` under random engine-like operation sequences:
the capacity is never exceeded, victims are only empty or resident unlocked, landed slots,
and the table's invariants (ARC's lists included) hold after every step."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken.experts.memory.slots import POLICIES, SlotTable, parse_policy, parse_policy_options

ALL = [p + extra for p in POLICIES for extra in ("", "+admit", "+prefetch", "+admit+prefetch")] + \
    [p + extra for p in ("lru", "lfu", "lrfu") for extra in ("+layer", "+admit+layer", "+admit+layer+prefetch",
                                                         "+admit+layer+prefetch+budget")] + \
    ["lrfu+prompt", "lrfu+admit+layer+prefetch+budget+prompt", "lrfu+admit+layer+prefetch+budget+prompt+path"]
L, E = 3, 4

layer_ids = st.lists(st.integers(0, E - 1), min_size=1, max_size=E, unique=True)
steps = st.lists(st.tuples(st.integers(0, L - 1), layer_ids, st.booleans(), st.booleans()), max_size=40)


@pytest.mark.parametrize("policy", ALL)
@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(0, 8), ops=steps, resize=st.integers(0, 8))
def test_victims_are_evictable_and_capacity_holds(policy, capacity, ops, resize):
    t = SlotTable(L * E, E, capacity, policy)
    for n, (layer, experts, admit, keep_locked) in enumerate(ops):
        ids = np.array(sorted(layer * E + e for e in experts), np.int64)
        slots = t.lookup(ids)
        hit = slots >= 0
        if t.prompt_weighted and keep_locked:        # a prefill-like call: its row's shares first
            t.learn_prompt(layer, np.array([sorted(experts)]))
        t.record(ids)
        t.touch(slots[hit])
        t.lock(slots[hit])
        miss = ids[~hit]
        cands = t.candidates(len(miss), miss)
        free = (t.locks == 0) & ~t.pending
        assert len(set(cands.tolist())) == len(cands) and all(free[c] for c in cands)
        assert all(t.owner[c] < 0 or t.slot_of[t.owner[c]] == c for c in cands)
        if admit and len(cands):
            ok = t.admit(miss, cands)
            cands = cands[np.flatnonzero(ok[:len(cands)])]
            miss = miss[ok]
        fill = miss[:len(cands)]
        t.assign(fill, cands[:len(fill)])
        t.ready(cands[:len(fill)])
        if not keep_locked:
            t.unlock(cands[:len(fill)])
            t.unlock(slots[hit])
        else:                      # a layer still running: its slots stay locked one more step
            t.unlock(slots[hit])
        t.check()
        assert t.resident <= t.capacity
        if keep_locked:
            t.unlock(cands[:len(fill)])
        ahead, victims = t.prefetch_after(ids)       # "+prefetch": the engine's background copies
        free = (t.locks == 0) & ~t.pending
        assert len(ahead) == len(victims) and all(free[v] for v in victims)
        assert all(a // E == layer + 1 for a in ahead) and (t.slot_of[ahead] < 0).all()
        assert len(ahead) == 0 or t.predictor is not None
        t.assign(ahead, victims)
        t.ready(victims)
        t.unlock(victims)
        t.check()
        if n == len(ops) // 2 and not t.locks.any():
            t.keep_most_recent(resize)
            t.check()


@pytest.mark.parametrize("policy", ALL)
def test_policy_names_parse(policy):
    base, admit = parse_policy(policy)
    assert base in POLICIES and admit == ("+admit" in policy)
    assert parse_policy_options(policy) == (base, admit, "+prefetch" in policy)


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(ValueError, match="lru, lfu, lrfu, arc"):
        parse_policy("clock")
    for bad in ("lru+prefetch+admit", "lru+admit+admit", "lru+", "lrfu+prefetch+prefetch", "lru+prefetch+layer",
                "arc+layer", "lrfu+path", "lrfu+admit+prompt+path", "lrfu+prefetch+path+budget"):
        with pytest.raises(ValueError, match="'\\+admit', then '\\+layer' \\(not with arc\\), then '\\+prefetch'"):
            parse_policy(bad)


@pytest.mark.parametrize("policy", ["lru", "lfu", "lrfu", "lru+layer", "lfu+layer", "lrfu+layer", "lrfu+prompt"])
@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(9, 80), seed=st.integers(0, 2**31 - 1), calls=st.integers(0, 120))
def test_few_victims_are_the_head_of_the_full_victim_order(policy, capacity, seed, calls):
    """`candidates` for a few victims of a large table (it sorts only the likely ones) gives the
    head of the whole table's victim order, here by Python's sort of every free slot's keys:
    empty slots by index, then furthest next use (layer-aware, when the pass does not fit), the
    policy's score, least recent."""
    rng = np.random.default_rng(seed)
    Lr, Er = 6, 16
    t = SlotTable(Lr * Er, Er, capacity, policy)
    for c in range(calls):
        layer = c % Lr
        t.serve(np.sort(rng.choice(Er, size=int(rng.integers(1, 6)), replace=False)) + layer * Er)
    busy = rng.choice(capacity, size=int(rng.integers(0, capacity // 3 + 1)), replace=False)
    t.lock(busy[: len(busy) // 2])
    t.pending[busy[len(busy) // 2:]] = True
    before = t.layer_ordered
    t.candidates(1)
    ordered = t.layer_ordered > before       # the victims go in next-use order now
    free = [s for s in range(capacity) if t.locks[s] == 0 and not t.pending[s]]

    def key(s):
        o = int(t.owner[s])
        if o < 0:
            return (0, 0, 0.0, s)
        nu = -int(t.next_use(np.array([o]))[0]) if ordered else 0
        return (1, nu, float(t.score(np.array([o]))[0]), int(t.stamp[s]))
    want = sorted(free, key=key)
    for k in (1, 2, 3, capacity // 8 - 1, capacity // 8, capacity):
        if k >= 1:
            assert t.candidates(k).tolist() == want[:k], (k, ordered)
