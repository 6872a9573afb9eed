"""The slot cache against a reference model (an ordered dict), under random step sequences."""
from collections import OrderedDict

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiered_helpers import make_pool, one_torch_thread  # noqa: F401

from freetoken.experts.memory.cache import ExpertCache
from freetoken.experts.memory.transfer import SyncCopyEngine, ThreadCopyEngine


class RefLRU:
    """The whole specification of the cache's residency, in a dozen lines."""

    def __init__(self, capacity):
        self.cap, self.od = capacity, OrderedDict()

    def step(self, requested, q):
        hits = [f for f in requested if f in self.od]
        for f in hits:
            self.od.move_to_end(f)
        misses = [f for f in requested if f not in self.od][:q]
        free = self.cap - len(self.od)
        evictable = [f for f in self.od if f not in hits]
        n_evict = min(max(0, len(misses) - free), len(evictable))
        for f in evictable[:n_evict]:
            del self.od[f]
        filled = misses[:min(len(misses), free + n_evict)]
        for f in filled:
            self.od[f] = None
        return hits, filled, evictable[:n_evict]


def cache_step(cache, requested, q, background=False):
    """What the tiered backend does with one layer-step, at the cache level."""
    uniq = np.unique(np.asarray(requested, np.int64))
    slots = cache.lookup(uniq)
    hit = slots >= 0
    hit_slots = slots[hit]
    cache.touch(hit_slots)
    cache.lock(hit_slots)
    misses = uniq[~hit][:q]
    cands = cache.candidates(len(misses))
    assert not set(cands.tolist()) & set(hit_slots.tolist()), "a hit was chosen as a victim"
    assert len(cands) == len(set(cands.tolist()))
    victims = cache.owner[cands][cache.owner[cands] >= 0]
    fill = misses[:len(cands)]
    job = cache.install(fill, cands[:len(fill)], background=background)
    if background:
        cache.drain()
    else:
        cache.ready(job, cands[:len(fill)])
        cache.unlock(cands[:len(fill)])
    cache.unlock(hit_slots)
    cache.check()
    return uniq[hit].tolist(), fill.tolist(), victims.tolist()


def contents_match(cache):
    for s in np.flatnonzero(cache.owner >= 0):
        f = int(cache.owner[s])
        for k, b in cache.banks.items():
            assert torch.equal(b[s], cache.pool.banks[k][f]), f"slot {s} does not hold expert {f}"


steps_st = st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 5), min_size=1, max_size=6),
                              st.integers(0, 6)), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(0, 18), steps=steps_st, background=st.booleans())
def test_cache_matches_reference_lru(capacity, steps, background):
    pool = make_pool(layers=3, experts=6, hidden=4, inter=2)
    cache = ExpertCache(pool, capacity, torch.device("cpu"), SyncCopyEngine())
    ref = RefLRU(capacity)
    for layer, experts, q in steps:
        requested = sorted({layer * 6 + e for e in experts})
        got = cache_step(cache, requested, q, background)
        want = ref.step(requested, q)
        assert got[0] == want[0] and got[1] == want[1] and sorted(got[2]) == sorted(want[2])
        assert cache.lru_order() == list(ref.od), "LRU order differs from the reference"
        assert cache.resident <= capacity
    contents_match(cache)


@settings(max_examples=30, deadline=None)
@given(capacity=st.integers(0, 18), new=st.integers(0, 18), steps=steps_st)
def test_resize_keeps_the_most_recent(capacity, new, steps):
    pool = make_pool(layers=3, experts=6, hidden=4, inter=2)
    cache = ExpertCache(pool, capacity, torch.device("cpu"))
    for layer, experts, q in steps:
        cache_step(cache, sorted({layer * 6 + e for e in experts}), q)
    before = cache.lru_order()
    cache.resize(new)
    cache.check()
    assert cache.capacity == new
    assert cache.lru_order() == before[max(0, len(before) - new):]
    contents_match(cache)
    cache_step(cache, [0, 1, 2], 3)                 # and it keeps working
    contents_match(cache)


def test_candidates_are_one_pass_least_recent_first():
    pool = make_pool(layers=1, experts=8, hidden=4, inter=2)
    cache = ExpertCache(pool, 5, torch.device("cpu"))
    cache_step(cache, [0, 1, 2], 3)                  # slots 0..2, two left empty
    cache_step(cache, [0], 0)                        # 0 is now the most recent
    c = cache.candidates(4)
    assert cache.owner[c].tolist() == [-1, -1, 1, 2]  # empty slots, then LRU order
    cache.lock(cache.lookup(np.array([1])))
    assert 1 not in cache.owner[cache.candidates(5)].tolist()


def test_background_fill_is_not_readable_or_evictable_until_it_lands():
    pool = make_pool(layers=1, experts=4, hidden=64, inter=64)
    engine = ThreadCopyEngine(bytes_per_s=pool.expert_nbytes / 0.05)   # one expert takes 50 ms
    cache = ExpertCache(pool, 1, torch.device("cpu"), engine)
    cache.install(np.array([2]), cache.candidates(1), background=True)
    assert cache.pending[0] and len(cache.candidates(1)) == 0 and cache.link_busy()
    cache.drain()
    assert not cache.pending[0] and cache.candidates(1).tolist() == [0]
    contents_match(cache)
    engine.close()


def test_resize_refuses_while_slots_are_in_use():
    cache = ExpertCache(make_pool(layers=1, experts=4, hidden=4, inter=2), 2, torch.device("cpu"))
    cache.lock(np.array([0]))
    with pytest.raises(RuntimeError):
        cache.resize(1)
