"""The host cache's pages faulted in ahead (host_rows.py `populate`, issue 39): the pages of the live
slots become resident without a byte of theirs changing (rows already read keep their bytes, the
others stay zero), a shrink during a populate is never undone (the freed tail's pages stay given
back), a stop ends it, and the cache runs it from its start and still holds every expert's bytes."""
from __future__ import annotations

import mmap
import threading

import numpy as np
import pytest
import torch

import freetoken.experts.disk.host_cache as host_cache
from freetoken.experts.disk.host_cache import HostExpertCache
from freetoken.experts.disk.host_rows import HostRows

from test_host_cache import _acquire_all, _layout
from helpers import rss_bytes



def _populate_works() -> bool:
    """Whether this OS faults pages in with MADV_POPULATE_WRITE (Linux 5.14+)."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    rows = HostRows(1, (4096,), torch.uint8)
    return rows.populate(threading.Event()) == 4096


needs_populate = pytest.mark.skipif(not _populate_works(), reason="no MADV_POPULATE_WRITE here (Linux 5.14+)")


@needs_populate
def test_populate_faults_pages_in_and_changes_no_byte():
    slots, row = 128, (256, 1024)                   # 128 slots of 256 KiB: 32 MiB
    rows = HostRows(slots, row, torch.uint8, 64, 256 * 1024 + 4096)    # framed: a lead and padding
    data = torch.randint(1, 256, (3, *row), dtype=torch.uint8)
    rows.bank[[0, 50, 127]] = data                  # rows "read" before the populate
    before = rss_bytes()
    done = rows.populate(threading.Event(), chunk=1 << 20)
    assert done == slots * rows.stride
    assert rss_bytes() - before > 24 * 2**20, "the untouched slots' pages were not faulted in"
    assert torch.equal(rows.bank[[0, 50, 127]], data)
    rest = np.setdiff1d(np.arange(slots), [0, 50, 127])
    assert int(rows.bank[torch.from_numpy(rest)].max()) == 0, "populate wrote into a slot"


@needs_populate
def test_populate_stops_at_a_stop_and_at_a_shrink():
    rows = HostRows(256, (256, 1024), torch.uint8)  # 64 MiB
    stop = threading.Event()
    stop.set()
    assert rows.populate(stop) == 0
    base = rss_bytes()
    got = []
    t = threading.Thread(target=lambda: got.append(rows.populate(threading.Event(), chunk=64 << 10)))
    t.start()
    rows.resize(np.arange(4), 4)                    # shrink while it runs: 1 MiB live
    t.join()
    assert got[0] <= 256 * 256 * 1024
    assert rss_bytes() - base < 8 * 2**20, "a populate after the shrink faulted the freed tail back in"
    assert rows.populate(threading.Event()) == 4 * 256 * 1024       # only the live slots


@needs_populate
@pytest.mark.parametrize("populate", [True, False])
def test_cache_populates_from_its_start_and_holds_every_expert(tmp_path, monkeypatch, populate):
    monkeypatch.setattr(host_cache, "POPULATE", populate)
    # (the populate thread at normal priority here: under SCHED_IDLE on a loaded box it may wait long)
    monkeypatch.setattr(host_cache.os, "sched_setscheduler", lambda *a: None)
    lay, want = _layout(tmp_path / "m.bin")
    cache = HostExpertCache(lay, 5, "lru", threads=2)
    try:
        full = sum(r.slots * r.stride for r in cache._rows.values())
        for _ in range(3000):                       # (the populate thread: a few ms here)
            if not populate or cache.populated == full:
                break
            threading.Event().wait(0.01)
        assert cache.populated == (full if populate else 0)
        assert cache.stats()["populated_gib"] == pytest.approx(cache.populated / 2**30)
        _acquire_all(cache, want, np.array([0, 3, 7, 9, 1, 11, 3]))    # (each round's bytes checked)
    finally:
        cache.close()
