"""Pinning the host expert pool in place (experts/memory/pinning.py): one registration per filled
bank, never a copy; all-or-nothing; on refusal pageable banks, hits on the device and misses on the CPU.
The register/unregister callables are the only fakes (they stand for cudaHostRegister)."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from freetoken.config import EngineConfig
from freetoken.loading import experts_backend as factory
from freetoken.experts.memory.pinning import PinError
from freetoken.experts.memory.pool import ExpertPool, ExpertSpec


def pool(layers=2, experts=4, hidden=64, inter=32) -> ExpertPool:
    n = layers * experts
    banks = {"gate_up": torch.randn(n, 2 * inter, hidden), "down": torch.randn(n, hidden, inter)}
    return ExpertPool(banks, layers, experts, ExpertSpec(hidden, inter))


class Recorder:
    def __init__(self, fail_at: int | None = None):
        self.registered: dict[int, int] = {}
        self.unregistered: list[int] = []
        self.fail_at = fail_at

    def register(self, t):
        if self.fail_at is not None and len(self.registered) == self.fail_at:
            raise RuntimeError("cudaErrorMemoryAllocation")
        self.registered[t.data_ptr()] = t.untyped_storage().nbytes()

    def unregister(self, t):
        self.unregistered.append(t.data_ptr())


def test_pin_registers_each_bank_in_place_once():
    p = pool()
    ptrs = {k: b.data_ptr() for k, b in p.banks.items()}
    before = {k: b.clone() for k, b in p.banks.items()}
    rec = Recorder()
    assert p.pin(rec.register, rec.unregister, limit=None) == p.nbytes
    assert p.pinned_bytes == p.nbytes
    assert {k: b.data_ptr() for k, b in p.banks.items()} == ptrs          # same buffers: no second copy
    assert sorted(rec.registered.values()) == sorted(b.nbytes for b in p.banks.values())
    assert sum(rec.registered.values()) == p.nbytes                       # no doubling, no rounding
    assert all(torch.equal(before[k], b) for k, b in p.banks.items())
    assert p.pin(rec.register, rec.unregister, limit=None) == p.nbytes    # once
    assert len(rec.registered) == len(p.banks)
    p.unpin()
    assert sorted(rec.unregistered) == sorted(ptrs.values()) and p.pinned_bytes == 0


def test_refusal_releases_what_was_pinned():
    p = pool()
    rec = Recorder(fail_at=1)
    with pytest.raises(PinError, match="cudaErrorMemoryAllocation"):
        p.pin(rec.register, rec.unregister, limit=None)
    assert p.pinned_bytes == 0 and rec.unregistered == list(rec.registered)


def test_memlock_limit_refuses_before_registering():
    p = pool()
    rec = Recorder()
    with pytest.raises(PinError, match="page-lock limit"):
        p.pin(rec.register, rec.unregister, limit=p.nbytes - 1)
    assert not rec.registered


class Recording:
    """The CPU branch's executor, recording which flat expert ids it was asked to run."""

    def __init__(self, inner):
        self.inner, self.ran = inner, []

    def run(self, x, ids, w):
        self.ran.append(set(ids[ids >= 0].tolist()))
        return self.inner.run(x, ids, w)


def _chosen(p, cfg, device):
    """Settings as the engine has them when no plan was made: the backend by the one rule."""
    import dataclasses
    from freetoken.memory.resolve import unplanned
    return dataclasses.replace(unplanned(cfg), **factory.backend_choice(p, cfg, torch.device(device)))


@pytest.mark.parametrize("backend", ["hybrid", "offload"])
def test_refused_pin_keeps_hits_on_the_device_and_runs_misses_on_the_cpu(backend, caplog):
    """Pinning refused (a fake pin function that fails): pageable banks, one warning; cache hits
    still run from the device cache, only the misses go to the CPU, and the answer equals the
    resident reference."""
    from freetoken.experts.execution.resident import ResidentExperts
    from freetoken.experts.execution.tiered import TieredExperts
    from tests.experts.tiered_helpers import random_step, torch_host
    p = pool(layers=2, experts=8, hidden=32, inter=16)
    cfg = EngineConfig(model="x", moe_backend=backend, expert_cache_slots=6)

    def refuse():
        raise PinError("ulimit -l 64 KiB")
    with caplog.at_level(logging.WARNING, logger="freetoken.experts"):
        experts, found = factory.build_experts(p, cfg, torch.device("cpu"), _chosen(p, cfg, "cpu"), pin=refuse)
    assert isinstance(experts, TieredExperts) and experts.planner.policy == "pageable"
    assert found == {"pinned": False}
    lines = [r for r in caplog.records if "cannot pin" in r.getMessage()]
    assert len(lines) == 1 and "ulimit -l" in lines[0].getMessage()
    experts.cpu.executor = rec = Recording(torch_host(p))
    ref = ResidentExperts(p, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    hits = 0
    for step in range(12):
        experts.begin_step("decode")
        for layer in range(p.num_layers):
            x, ids, w = random_step(p, 1, 2, g, hot=3)
            # offload lands in-flight copies (prefetches) before it decides, so they are hits
            # there; hybrid runs one on the CPU rather than wait, unless it lands before the call
            # decides (a race with the copy thread: either way is right)
            cached = set(int(f) for f in np.flatnonzero(experts.cache.slot_of >= 0))
            landed = set(f for f in cached if backend == "offload" or not experts.cache.pending[experts.cache.slot_of[f]])
            rec.ran.clear()
            out = experts.forward(layer, x, ids, w)
            torch.testing.assert_close(out, ref.forward(layer, x, ids, w), rtol=1e-5, atol=1e-5)
            flat = set((ids + layer * p.num_experts).flatten().tolist())
            ran_on_cpu = set().union(*rec.ran)
            assert flat - cached <= ran_on_cpu <= flat - landed    # misses only: hits never go to the CPU
            hits += len(flat - ran_on_cpu)
        experts.cache.drain()                                 # background fills land between steps
    assert hits > 0                                            # the cache warmed from pageable banks
    total = experts.stats()["total"]
    assert total["fills"] == 0 and total["warm_fills"] > 0 and total["hits"] == hits   # no fill waits
    experts.close()


def test_plan_says_what_the_pageable_fallback_does():
    from freetoken.experts.memory.planner import MissPlanner
    pl = MissPlanner(16, "pageable")
    misses, tokens = np.array([3, 5, 9]), np.array([1, 2, 1])
    plan = pl.plan(misses, tokens, 1e9, 2e9)
    assert len(plan.fill) == 0 and plan.warm.tolist() == [5] and sorted(plan.cpu.tolist()) == [3, 9]
    busy = pl.plan(misses, tokens, 1e9, 2e9, link_busy=True)
    assert len(busy.fill) == 0 and len(busy.warm) == 0 and sorted(busy.cpu.tolist()) == [3, 5, 9]


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.cuda
@cuda
def test_cuda_register_pins_in_place():
    p = pool(hidden=256, inter=128)
    ptrs = {k: b.data_ptr() for k, b in p.banks.items()}
    assert p.pin(limit=None) == p.nbytes
    assert all(b.is_pinned() for b in p.banks.values())
    assert {k: b.data_ptr() for k, b in p.banks.items()} == ptrs
    dev = p.banks["down"].to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(dev.cpu(), p.banks["down"])
    p.unpin()
    assert not any(b.is_pinned() for b in p.banks.values())


@pytest.mark.cuda
@cuda
def test_cuda_hybrid_backend_uses_the_pinned_pool():
    p = pool(hidden=256, inter=128)
    cfg = EngineConfig(model="x", moe_backend="hybrid", expert_cache_slots=2)
    experts, found = factory.build_experts(p, cfg, torch.device("cuda"), _chosen(p, cfg, "cuda"))
    assert found == {} and p.pinned_bytes == p.nbytes
    getattr(experts, "close", lambda: None)()
    p.unpin()


@pytest.mark.cuda
@cuda
def test_caching_host_allocator_rounds_as_the_plan_counts():
    """PyTorch's pinned host allocator (state checkpoints) takes the next power of two per
    request: what memory/plan.py counts (pinning.caching_host_block)."""
    from freetoken.experts.memory.pinning import caching_host_block
    n = 37 * 2**20 + 5                       # a size no earlier test left cached
    before = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
    t = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    after = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
    assert after - before == caching_host_block(n) == 64 * 2**20
    del t
