"""Pinning the host expert pool in place (experts/pinning.py): one registration per filled
bank, never a copy; all-or-nothing with pageable banks and the cpu backend on refusal.
The register/unregister callables are the only fakes (they stand for cudaHostRegister)."""
from __future__ import annotations

import logging

import pytest
import torch

from freetoken.config import EngineConfig
from freetoken.experts import factory
from freetoken.experts.pinning import PinError
from freetoken.experts.pool import ExpertPool, ExpertSpec


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


def test_factory_falls_back_to_cpu_with_one_warning(monkeypatch, caplog):
    """A CUDA hybrid backend whose pool cannot be pinned: pageable banks, every expert on the
    CPU, one warning line."""
    p = pool()
    monkeypatch.setattr(factory, "_pinned", lambda _p: False)
    monkeypatch.setattr(p, "pin", lambda *a, **k: (_ for _ in ()).throw(PinError("ulimit -l 64 KiB")))
    cfg = EngineConfig(model="x", moe_backend="hybrid", expert_cache_slots=2)
    with caplog.at_level(logging.WARNING, logger="freetoken.experts"):
        experts = factory.build_experts(p, cfg, torch.device("cuda"))
    assert experts.settings["moe_backend"] == "cpu"
    lines = [r for r in caplog.records if "cannot pin" in r.getMessage()]
    assert len(lines) == 1 and "ulimit -l" in lines[0].getMessage()
    getattr(experts, "close", lambda: None)()


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
    experts = factory.build_experts(p, cfg, torch.device("cuda"))
    assert experts.settings["moe_backend"] == "hybrid" and p.pinned_bytes == p.nbytes
    getattr(experts, "close", lambda: None)()
    p.unpin()
