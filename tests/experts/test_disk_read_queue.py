"""The host cache's reads in priority order (experts/disk/read_queue.py): demand reads start before
every queued guess, a guess needed now is promoted, a cancelled guess never reads; the host cache
drops the guesses a layer call did not route before they read a byte, keeps every other expert's
bytes right, and reads ahead only within its read budget."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from freetoken import LLM
from freetoken.experts.disk.host_cache import HostExpertCache
from freetoken.experts.disk import read_queue
from freetoken.experts.disk.read_queue import DEMAND, GUESS, ReadQueue
from test_host_cache import E, _holds, _layout
from tiered_helpers import disk_outputs, resident_ftw


@pytest.fixture(scope="module")
def ftw(tiny_dir, tmp_path_factory):
    return resident_ftw(tiny_dir, tmp_path_factory.mktemp("rq"))


def _blocked_queue():
    """A one-thread queue whose first read ("first") waits for the returned event: everything
    queued after it waits in the queue, in its order."""
    done, gate, started = [], threading.Event(), threading.Event()

    def read(flat, slot):
        if flat == "first":
            started.set()
            gate.wait(10)
        done.append(flat)

    q = ReadQueue(1, read)
    q.put("first", 0, GUESS)
    assert started.wait(10)
    return q, done, gate


def test_demand_reads_go_before_guesses_and_promoted_guesses_before_the_rest():
    q, done, gate = _blocked_queue()
    q.put("g1", 1, GUESS)
    q.put("g2", 2, GUESS)
    q.put("d1", 3, DEMAND)
    q.promote(2)                    # g2 needed now: behind d1, ahead of g1
    q.put("d2", 4, DEMAND)
    assert q.guesses == 1
    gate.set()
    q.shutdown()
    assert done == ["first", "d1", "g2", "d2", "g1"]


def test_guesses_beside_a_demand_read_are_held_back_until_it_lands(monkeypatch):
    """While a demand read is in flight, no more than `GUESSES_BESIDE_DEMAND` guess reads start
    (a miss shares the disk with every read in flight); the rest start once it has landed, and
    a shutdown still runs them."""
    monkeypatch.setattr(read_queue, "GUESSES_BESIDE_DEMAND", 1)
    log, lock, gate = [], threading.Lock(), threading.Event()
    started = {"d": threading.Event(), "g1": threading.Event()}

    def read(flat, slot):
        with lock:
            log.append(("start", flat))
        if flat in started:
            started[flat].set()
            gate.wait(30)
        with lock:
            log.append(("end", flat))

    q = ReadQueue(3, read, reserve=True)
    q.put("d", 0, DEMAND)
    assert started["d"].wait(30)
    q.put_many([("g1", 1, GUESS), ("g2", 2, GUESS), ("g3", 3, GUESS)])
    assert started["g1"].wait(30)       # g1 starts beside d; g2 and g3 wait though a reader is idle
    threading.Event().wait(0.2)
    assert [f for k, f in log if k == "start"] == ["d", "g1"]
    gate.set()
    q.shutdown()
    running, most = set(), 0               # guesses being read while d was, at any time: never more than 1
    for k, f in log:
        running = running | {f} if k == "start" else running - {f}
        if "d" in running:
            most = max(most, len(running - {"d"}))
    assert most == 1
    assert {f for k, f in log if k == "end"} == {"d", "g1", "g2", "g3"} and q.guesses == 0


def test_without_a_limit_guesses_start_beside_a_demand_read(monkeypatch):
    monkeypatch.setattr(read_queue, "GUESSES_BESIDE_DEMAND", None)
    gate, started, seen = threading.Event(), threading.Event(), []

    def read(flat, slot):
        seen.append(flat)
        if flat == "d":
            started.set()
            gate.wait(10)

    q = ReadQueue(3, read, reserve=True)
    q.put("d", 0, DEMAND)
    assert started.wait(10)
    q.put_many([("g1", 1, GUESS), ("g2", 2, GUESS)])
    for _ in range(200):
        if len(seen) == 3:
            break
        threading.Event().wait(0.01)
    assert sorted(seen) == ["d", "g1", "g2"]          # both guesses read while d still waits
    gate.set()
    q.shutdown()


def test_a_cancelled_read_never_runs_and_a_started_one_cannot_be_cancelled():
    q, done, gate = _blocked_queue()
    q.put("g1", 1, GUESS)
    q.put("g2", 2, GUESS)
    assert q.queued_guesses() == [("g1", 1), ("g2", 2)]
    assert q.cancel(1) and not q.cancel(1)
    assert not q.cancel(0)          # "first" is running
    gate.set()
    q.shutdown()
    assert done == ["first", "g2"] and q.guesses == 0


def test_guesses_a_call_did_not_route_are_dropped_before_reading(tmp_path):
    lay, want = _layout(tmp_path / "f.bin")
    cache = HostExpertCache(lay, 8, "lru", threads=1)
    gate, read = threading.Event(), cache.reader.read
    cache.reader.read = lambda flat, *a: (gate.wait(10), read(flat, *a))[1]
    try:
        guesses = np.arange(E, E + 4)                   # layer 1's experts 0..3 guessed
        assert cache.prefetch(guesses) == 4
        routed = np.array([E + 2, E + 5])               # layer 1 routed 2 (guessed) and 5
        dropped = cache.cancel_guesses(1, routed)
        assert dropped >= 2                             # 0 may have started; 1 and 3 were queued
        gate.set()
        n, slots = cache.acquire(routed)
        _holds(cache, want, routed[:n], slots)
        cache.release(slots)
        cache.drain()
        cache.check()
        st = cache.stats()
        assert st["cancelled"] == dropped and st["reads"] == 4 - dropped + 1
        assert (cache.table.slot_of[[E + 1, E + 3]] < 0).all()      # never read, not resident
        assert st["prefetch_used"] == 1                             # the right guess (E + 2)
    finally:
        gate.set()
        cache.close()


def test_read_ahead_stays_within_the_read_budget(tmp_path):
    lay, want = _layout(tmp_path / "f.bin")
    cache = HostExpertCache(lay, 12, "lru", threads=2, read_budget=1.5)
    try:
        assert cache.prefetch(np.arange(E, E + 3)) == 0         # nothing read yet: no room to guess
        assert cache.stats()["budget_cut"] == 3
        n, slots = cache.acquire(np.arange(4))                  # 4 misses: room for int(1.5 * 4) - 4 = 2
        cache.release(slots)
        assert cache.prefetch(np.arange(E, E + 3)) == 2         # the likeliest two (first in the list)
        assert cache.prefetch(np.arange(E, E + 3), budgeted=False) == 1   # a sure read: no budget,
        assert cache.table.budget.transfers == 4 + 2            # and not charged to it either
        cache.drain()
        _holds(cache, want, np.arange(E, E + 3), cache.table.slot_of[E:E + 3])
        cache.check()
    finally:
        cache.close()


def test_tokens_identical_under_a_read_budget_that_holds(ftw, monkeypatch):
    """The engine with the read budget on (backend.READ_BUDGET; off by default): the resident
    pool's logits and tokens, guesses cut, and every read so far within the ratio x the reads
    without guessing."""
    import freetoken.experts.disk.backend as backend
    monkeypatch.setattr(backend, "READ_BUDGET", 1.1)
    path, (logits, tokens) = ftw
    llm = LLM(str(path), dtype="float32", host_cache_slots=4, prefix_cache=False, expert_lookahead="router")
    try:
        g_logits, g_tokens = disk_outputs(llm)
        assert torch.equal(g_logits, logits) and g_tokens == tokens
        cache = llm.engine.model.experts.cache
        cache.drain()
        cache.check()
        b = cache.table.budget
        assert llm.expert_stats()["lookahead"]["budget_cut"] > 0
        assert 0 < b.transfers <= b.ratio * (b.misses + b.used)
    finally:
        llm.close()


def test_a_call_waits_for_whichever_read_lands_first(tmp_path):
    """`wait_any`: with the first-queued read held back, the wait ends when a later one lands
    (its bytes right), not when the held one does; a queue's reads put at once all run."""
    lay, want = _layout(tmp_path / "f.bin")
    cache = HostExpertCache(lay, 8, "lru", threads=2)
    gate, read = threading.Event(), cache.reader.read
    cache.reader.read = lambda flat, *a: (flat != 0 or gate.wait(10), read(flat, *a))[1]
    try:
        ids = np.array([0, 1])
        n, slots, pending = cache.acquire_nowait(ids)
        assert n == 2 and all(ev is not None for ev in pending)
        cache.wait_any(pending)
        assert pending[1].is_set() and not pending[0].is_set()
        _holds(cache, want, ids[1:], slots[1:])
        gate.set()
        cache.landed(ids, pending)
        _holds(cache, want, ids, slots)
        cache.release(slots)
        cache.check()
    finally:
        gate.set()
        cache.close()


def test_a_reader_outlives_a_read_that_raises():
    done = []

    def read(flat, slot):
        if flat == "bad":
            raise OSError("EIO")
        done.append(flat)

    q = ReadQueue(1, read)
    q.put_many([("bad", 0, DEMAND), ("good", 1, DEMAND)])
    q.shutdown()
    assert done == ["good"]


def test_a_demand_read_starts_while_every_reader_reads_a_guess():
    """`reserve`: with the one general reader held by a guess, a demand read (put, or a queued
    guess promoted) runs on the reserved reader at once; a further guess waits for the general one."""
    done, gate, started, ran = [], threading.Event(), threading.Event(), threading.Event()

    def read(flat, slot):
        if flat == "g0":
            started.set()
            gate.wait(10)
        done.append(flat)
        if flat == "g1":
            ran.set()

    q = ReadQueue(1, read, reserve=True)
    try:
        q.put("g0", 0, GUESS)
        assert started.wait(10)
        q.put_many([("g1", 1, GUESS), ("d1", 2, DEMAND)])
        for _ in range(1000):
            if "d1" in done:
                break
            threading.Event().wait(0.01)
        assert done == ["d1"]               # g0 still held, g1 queued behind it
        q.promote(1)                        # g1 needed now: the reserved reader takes it
        assert ran.wait(10) and done == ["d1", "g1"]
    finally:
        gate.set()
        q.shutdown()
    assert done == ["d1", "g1", "g0"]


def test_a_queue_dropped_without_shutdown_is_collected_and_its_readers_stop():
    """The readers hold the queue (and the cache its reads belong to) only while they read: a
    cache dropped unclosed frees its slots' memory, as with a thread pool's workers."""
    import gc
    import weakref
    done = []
    q = ReadQueue(2, lambda flat, slot: done.append(flat), reserve=True)
    q.put_many([("a", 0, DEMAND), ("b", 1, GUESS)])
    readers, gone = list(q._readers), weakref.ref(q)
    for _ in range(1000):
        if len(done) == 2:
            break
        threading.Event().wait(0.01)
    del q
    gc.collect()
    assert gone() is None
    for t in readers:
        t.join(10)
        assert not t.is_alive()
    assert sorted(done) == ["a", "b"]


@pytest.mark.skipif(not hasattr(__import__("os"), "SCHED_BATCH"), reason="no SCHED_BATCH here")
@pytest.mark.parametrize("which", ["all", "guesses"])
def test_readers_under_sched_batch_read_as_before(ftw, which, monkeypatch):
    """`READERS_BATCH`: the readers it names run under SCHED_BATCH (the policy read back from the OS
    for the thread that ran each read; "guesses": the demand-only reader keeps the default) and the
    disk tier's logits and tokens are the resident pool's."""
    import os
    monkeypatch.setattr(read_queue, "READERS_BATCH", which)
    policies, gate = [], threading.Event()

    def read(flat, slot):
        policies.append((flat, os.sched_getscheduler(threading.get_native_id())))
        if flat == "hold":
            gate.wait(10)

    q = ReadQueue(1, read, reserve=True)
    q.put("hold", 0, GUESS)           # the one shared reader busy: the demand read goes to the reserve
    while not policies:
        threading.Event().wait(0.01)
    q.put("demand", 1, DEMAND)
    while len(policies) < 2:
        threading.Event().wait(0.01)
    gate.set()
    q.shutdown()
    got = dict(policies)
    assert got["hold"] == os.SCHED_BATCH
    assert got["demand"] == (os.SCHED_BATCH if which == "all" else os.sched_getscheduler(0))
    path, (logits, tokens) = ftw
    llm = LLM(str(path), dtype="float32", host_cache_slots=4, prefix_cache=False)
    try:
        g_logits, g_tokens = disk_outputs(llm)
        assert torch.equal(g_logits, logits) and g_tokens == tokens
    finally:
        llm.close()
