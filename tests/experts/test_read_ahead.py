"""Reading ahead (the disk tier's lookahead, experts/disk/lookahead.py) changes only when bytes
arrive, and must not make the cache read more:
  - a read-ahead never takes the slot of an expert needed as soon as the one it brings or
    sooner (do no harm), never a locked or pending slot, each slot once;
  - on a layer-cyclic stream (every pass routes the same experts), reading each next layer's
    experts ahead needs no more reads per pass than fetching on demand, and leaves no demand miss;
  - the history predictor with `wrap` learns the last layer -> next token's layer 0 step."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken.experts.memory.next_layer import NextLayerPredictor
from freetoken.experts.memory.slots import SlotTable


def _calls_until(layer: int, current: int, L: int) -> int:
    """Layer calls from `current` until `layer` runs again, by walking the layers."""
    for d in range(1, L + 1):
        if (current + d) % L == layer:
            return d
    raise AssertionError


def _serve(t: SlotTable, ids: np.ndarray) -> None:
    ids = np.unique(ids)
    t.record(ids)
    s = t.slot_of[ids]
    hit = s >= 0
    t.lock(s[hit])
    t.touch(s[hit])
    miss = ids[~hit]
    v = t.candidates(len(miss), miss)
    t.assign(miss[:len(v)], v)
    t.ready(v)
    t.unlock(np.concatenate([s[hit], v]))


@settings(max_examples=150, deadline=None)
@given(L=st.integers(2, 5), E=st.integers(2, 8), policy=st.sampled_from(["lru+layer", "lfu+layer", "lrfu+layer", "lrfu"]),
       data=st.data())
def test_read_ahead_does_no_harm(L, E, policy, data):
    slots = data.draw(st.integers(1, L * E))
    t = SlotTable(L * E, E, slots, policy)
    calls = data.draw(st.lists(st.lists(st.integers(0, E - 1), min_size=1, max_size=E), min_size=1, max_size=3 * L))
    for i, local in enumerate(calls):
        _serve(t, np.asarray(local, np.int64) + (i % L) * E)
    held = data.draw(st.lists(st.integers(0, slots - 1), max_size=slots, unique=True))
    t.lock(np.asarray(held, np.int64))                      # another caller's call holds these
    want = np.asarray(data.draw(st.lists(st.integers(0, L * E - 1), max_size=L * E, unique=True)), np.int64)
    want = want[t.slot_of[want] < 0]
    cur = (len(calls) - 1) % L
    order = np.argsort([_calls_until(f // E, cur, L) for f in want.tolist()], kind="stable")
    want = want[order]                                       # soonest needed first
    ids, got = t.read_ahead_victims(want)
    assert len(ids) == len(got) and len(set(got.tolist())) == len(got)
    assert set(ids.tolist()) <= set(want.tolist())
    for f, s in zip(ids.tolist(), got.tolist()):
        assert t.locks[s] == 0 and not t.pending[s]
        owner = int(t.owner[s])
        if owner >= 0:
            assert _calls_until(owner // E, cur, L) > _calls_until(f // E, cur, L), \
                f"expert {owner} (needed sooner or as soon) gave its slot to {f}"


@settings(max_examples=60, deadline=None)
@given(L=st.integers(2, 5), E=st.integers(4, 16), data=st.data())
def test_reading_the_next_layer_ahead_costs_no_extra_reads(L, E, data):
    K = data.draw(st.integers(1, E))
    slots = data.draw(st.integers(K, L * K))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    routes = [np.sort(rng.choice(E, K, replace=False)) + m * E for m in range(L)]

    def window(ahead: bool) -> tuple[int, int]:
        """(reads, demand misses) over passes 8..23, after the start's transient."""
        t = SlotTable(L * E, E, slots, "lrfu+layer")
        reads = demand = 0
        for p in range(24):
            for m in range(L):
                miss = int((t.slot_of[routes[m]] < 0).sum())
                _serve(t, routes[m])
                got = 0
                if ahead:
                    want = routes[(m + 1) % L]
                    ids, v = t.read_ahead_victims(want[t.slot_of[want] < 0])
                    t.assign(ids, v)
                    t.ready(v)
                    t.unlock(v)
                    got = len(ids)
                if p >= 8:
                    reads, demand = reads + miss + got, demand + miss
        return reads, demand

    plain, _ = window(False)
    reads, demand = window(True)
    assert reads <= plain + K        # the same rate: at most a layer's reads moved into the window
    assert demand == 0


def test_wrap_learns_the_last_layer_to_the_next_tokens_first():
    L, E = 3, 8
    routes = [np.array([1, 4]), np.array([0, 7]), np.array([2, 5])]
    on, off = NextLayerPredictor(L, E, wrap=True), NextLayerPredictor(L, E)
    for _ in range(3):
        for m in range(L):
            on.observe(m, routes[m])
            off.observe(m, routes[m])
    assert on.predict(L - 1, routes[L - 1]).tolist() == routes[0].tolist()
    assert on.predict(0, routes[0]).tolist() == routes[1].tolist()
    assert off.predict(L - 1, routes[L - 1]).tolist() == [] and not off.pairs[L - 1].any()
