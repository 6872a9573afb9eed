"""Resizing the host expert cache between layer calls, against a reference (each expert's bytes
as the file has them): over random sequences of acquires, background prefetches and resizes
(down to one slot), no slot is lost or duplicated, the residents after a resize are a subset
of those before and the ones the policy values most, every resident slot holds exactly its
expert's bytes, and a shrink gives its pages back to the OS."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken.experts.disk.host_cache import HostExpertCache
from freetoken.experts.disk.host_rows import HostRows

from test_host_cache import E, L, _acquire_all, _holds, _layout
from helpers import rss_bytes

ops = st.lists(st.one_of(
    st.tuples(st.sampled_from(["acquire", "prefetch"]),
              st.lists(st.integers(0, L * E - 1), min_size=1, max_size=8, unique=True)),
    st.tuples(st.just("resize"), st.integers(1, L * E))), min_size=1, max_size=30)


def _value(table, flats):
    """(policy score, recency) of resident flats: what a shrink keeps the highest of."""
    slots = table.slot_of[flats]
    return list(zip(table.score(flats).tolist(), table.stamp[slots].tolist()))


@settings(max_examples=60, deadline=None)
@given(ops=ops, slots=st.integers(1, 9), policy=st.sampled_from(["lru", "lfu", "lrfu", "arc"]))
def test_resizes_between_calls_keep_the_cache_exact(tmp_path_factory, ops, slots, policy):
    lay, want = _layout(tmp_path_factory.mktemp("hcr") / "f.bin")
    cache = HostExpertCache(lay, slots, policy, threads=3)
    try:
        for op, arg in ops:
            if op == "resize":
                cache.drain()           # reads in flight land before the policy ranks them
                res = np.flatnonzero(cache.table.slot_of >= 0)
                value = dict(zip(res.tolist(), _value(cache.table, res)))
                kept = cache.resize(arg)
                after = set(np.flatnonzero(cache.table.slot_of >= 0).tolist())
                assert cache.capacity == arg and after <= set(value) and kept == len(after) == min(arg, len(value))
                gone = set(value) - after
                if policy != "arc" and gone and after:      # arc: its own REPLACE order, not a score
                    assert max(value[f] for f in gone) <= min(value[f] for f in after)
                for name, b in cache.banks.items():
                    assert b.shape[0] == arg, name
            elif op == "prefetch":
                cache.prefetch(np.array(sorted(arg), np.int64))
            else:
                _acquire_all(cache, want, np.array(sorted(arg), np.int64))
            cache.check()
            cache.drain()
            res = np.flatnonzero(cache.table.slot_of >= 0)
            _holds(cache, want, res, cache.table.slot_of[res])     # every resident holds its bytes
        assert (cache.table.locks == 0).all()
    finally:
        cache.close()


def test_resize_waits_for_prefetches_in_flight(tmp_path):
    """A shrink right after background reads started: they land before any row moves, and the
    survivors hold their own bytes (no read lands in a slot that moved or went)."""
    lay, want = _layout(tmp_path / "f.bin")
    for target in (1, 3, 7, 12):
        cache = HostExpertCache(lay, 12, "lru", threads=4)
        try:
            cache.prefetch(np.arange(12))
            cache.resize(target)
            cache.check()
            assert not cache.table.pending.any()
            res = np.flatnonzero(cache.table.slot_of >= 0)
            assert len(res) == target
            _holds(cache, want, res, cache.table.slot_of[res])
        finally:
            cache.close()


def test_shrink_returns_memory_and_grow_reuses_the_mapping():
    slots, row = 256, (256, 1024)                   # 256 slots of 256 KiB: 64 MiB
    rows = HostRows(slots, row, torch.uint8)
    rows.bank.fill_(7)                              # every page touched
    full = rss_bytes()
    keep = np.array([3, 100, 255])
    rows.bank[keep] = torch.arange(3, dtype=torch.uint8)[:, None, None] + 1
    bank = rows.resize(keep, 4)
    assert bank.shape == (4, *row)
    assert [int(bank[i, 0, 0]) for i in range(3)] == [1, 2, 3] and int(bank[1].min()) == 2
    assert full - rss_bytes() > 48 * 2**20, "a shrink to 4 of 256 slots must give back most of 64 MiB"
    mapped = rows.mapped_nbytes
    grown = rows.resize(np.arange(4), 128)          # within the mapping: no new map, rows stay
    assert rows.mapped_nbytes == mapped and [int(grown[i, 0, 0]) for i in range(3)] == [1, 2, 3]
    assert int(grown[4:].max()) == 0, "the shrunk tail's pages were kept (a shared map's DONTNEED), not given back"
    bigger = rows.resize(np.array([0, 2]), 300)     # past it: a new mapping, survivors copied
    assert rows.mapped_nbytes == 300 * 256 * 1024 and [int(bigger[i, 5, 5]) for i in range(2)] == [1, 3]


def test_framed_rows_keep_their_lead_through_shrink_and_grow():
    """Rows framed for O_DIRECT (a 32-byte lead, a 512-multiple stride): each row sits at its
    frame's lead, and a shrink or a grow past the mapping keeps the survivors' bytes there."""
    row, lead, stride = (3, 100), 32, 512
    rows = HostRows(8, row, torch.uint8, lead, stride)
    data = torch.randint(0, 256, (8, *row), dtype=torch.uint8)
    rows.bank.copy_(data)
    for s in range(8):
        assert bytes(rows.frame(s)[lead:lead + 300]) == data[s].numpy().tobytes()
    keep = np.array([1, 4, 6])
    for slots in (3, 50):                          # shrink in place, then grow past the mapping
        bank = rows.resize(keep if slots == 3 else np.arange(3), slots)
        assert bank.stride(0) == stride and torch.equal(bank[:3], data[keep])
        for i in range(3):
            assert bytes(rows.frame(i)[lead:lead + 300]) == data[keep[i]].numpy().tobytes()
    with pytest.raises(ValueError, match="do not frame"):
        HostRows(2, row, torch.uint8, 300, 512)
