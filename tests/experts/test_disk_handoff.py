"""A layer call hands its victims' slots to the next layer's reads as soon as those experts have
run (experts/disk/handoff.py): with a host cache far below a step's experts and reads delayed
by drawn amounts (landing in any order), the prompt logits and greedy tokens stay the resident
pool's bit for bit, calls really were handed off, and a handoff never reads more experts than
the slots it gave up (so it cannot take the slots of layers needed sooner)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken import LLM
from freetoken.experts.disk.handoff import GROUP, Handoff
from tiered_helpers import disk_outputs, outputs_hold_under_delayed_reads, resident_ftw


@pytest.fixture(scope="module")
def ftw(tiny_dir, tmp_path_factory):
    return resident_ftw(tiny_dir, tmp_path_factory.mktemp("ho"))


def test_tokens_identical_with_handoffs_and_reads_landing_in_any_order(ftw, monkeypatch):
    import freetoken.experts.disk.backend as backend
    monkeypatch.setattr(backend, "HANDOFF", True)       # (off by default: backend.HANDOFF)
    monkeypatch.setattr(backend, "READ_BUDGET", None)   # every handoff may start its reads (no read budget)
    path, (logits, tokens) = ftw
    llm = LLM(str(path), dtype="float32", host_cache_slots=4, prefix_cache=False, expert_lookahead="history")
    gave: list[int] = []
    plan = Handoff.plan.__func__

    def counted(cls, cache, ids, slots, nxt):        # every handoff: reads started <= slots given up
        h = plan(cls, cache, ids, slots, nxt)
        if h is not None:
            ran = h.ran

            def checked(idx):
                before, started = int(h.done.sum()), h.started
                ran(idx)
                assert h.started - started <= int(h.done.sum()) - before
                gave.append(int(h.done.sum()) - before)
            h.ran = checked
        return h

    Handoff.plan = classmethod(counted)
    try:
        outputs_hold_under_delayed_reads(llm, (logits, tokens), [0.0, 0.0005, 0.002, 0.004], examples=6)
        handed_off(path, logits, tokens)
        assert max(gave) > 0
    finally:
        Handoff.plan = classmethod(plan)
        llm.close()


def handed_off(path, logits, tokens):
    """The handoff forced rather than left to timing: a call hands off only when all its experts
    get slots at once, which reads still in flight (delayed above, or slow under load) may prevent
    on every call. Here every read lands before its caller goes on, so which calls hand off
    depends on the routing alone: with 5 slots the tiny model's decode hands off some."""
    llm = LLM(str(path), dtype="float32", host_cache_slots=5, prefix_cache=False, expert_lookahead="history")
    experts = llm.engine.model.experts
    cache = experts.cache
    prefetch, acquire = cache.prefetch, cache.acquire_nowait

    def prefetch_landed(*args, **kw):
        started = prefetch(*args, **kw)
        cache.drain()
        return started

    def acquire_landed(ids):
        n, slots, pending = acquire(ids)
        cache.landed(ids[:n], pending)
        return n, slots, pending

    cache.prefetch, cache.acquire_nowait = prefetch_landed, acquire_landed
    try:
        g_logits, g_tokens = disk_outputs(llm)
        assert torch.equal(g_logits, logits) and g_tokens == tokens
        assert experts.stats()["disk"]["handoffs"] > 0
        cache.check()
    finally:
        llm.close()


def test_victims_run_first_in_small_groups():
    class Cache:            # only what `first` reads
        pass
    h = Handoff(Cache(), np.arange(8), np.arange(8), np.arange(8, 16), give=np.array([1, 3, 4, 6, 7]))
    ready = np.ones(8, bool)
    first = h.first(ready)
    assert first.sum() == GROUP and set(np.flatnonzero(first)) <= {1, 3, 4, 6, 7}
    h.done[[1, 3, 4, 6, 7]] = True              # every victim released: the rest run together
    assert np.array_equal(h.first(ready & ~h.done), ready & ~h.done)
    none_landed = np.zeros(8, bool)
    none_landed[[0, 2]] = True                  # no victim landed yet: what has landed runs
    h.done[:] = False
    assert np.array_equal(h.first(none_landed), none_landed)
