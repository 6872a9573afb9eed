"""The plan's budget: host memory less a stated headroom (default max(10%, 2 GiB), an option
to change it); sizes that do not move with what happens to be free at launch; pinned bytes."""
from __future__ import annotations

import pytest

from freetoken.config import EngineConfig
from freetoken.memory import plan as plan_mod
from freetoken.memory.model_size import read_model_shape
from freetoken.memory.plan import host_budget, host_headroom, make_plan
from freetoken.memory.probe import GiB, MachineMemory


def test_default_headroom_is_ten_percent_or_two_gib():
    assert host_headroom(MachineMemory(24 * GiB, 0, "t")) == int(2.4 * GiB)
    assert host_headroom(MachineMemory(8 * GiB, 0, "t")) == 2 * GiB
    cfg = EngineConfig(model="x", memory_headroom_gib=5)
    assert host_budget(MachineMemory(24 * GiB, 0, "t"), cfg) == 19 * GiB


def test_bad_headroom_is_refused():
    with pytest.raises(Exception, match="memory_headroom_gib"):
        EngineConfig(model="x", memory_headroom_gib=-1)


def test_sizes_do_not_move_with_momentary_free_memory(tiny_dir):
    """The same machine at launches with 30% .. 100% of its budget free: the same options
    (prefill chunk, max_model_len, KV, caches) every time; a line when free < planned."""
    src = tiny_dir("qwen3_moe")
    shape = read_model_shape(src)
    cfg = EngineConfig(model=str(src), dtype="float32", max_model_len=10**6, kv_cache_gib=64,
                       max_num_batched_tokens=8192)
    total = int(2.6 * GiB)
    seen = []
    for frac in (0.3, 0.5, 0.7, 0.9, 1.0):
        resolved, plan = make_plan(cfg, shape, MachineMemory(total, int(frac * total), "test"))
        seen.append((resolved.max_num_batched_tokens, resolved.max_model_len, resolved.kv_cache_gib))
        low = [w for w in plan.warnings if "free now" in w]
        assert len(low) == (1 if frac * total < plan.used("host") else 0)
        assert plan.used("host") <= plan.available["host"] == total - 2 * GiB
    assert len(set(seen)) == 1


def test_headroom_option_changes_the_budget(tiny_dir):
    src = tiny_dir("qwen3_moe")
    shape = read_model_shape(src)
    m = MachineMemory(8 * GiB, 8 * GiB, "test")
    _, a = make_plan(EngineConfig(model=str(src)), shape, m)
    _, b = make_plan(EngineConfig(model=str(src), memory_headroom_gib=6), shape, m)
    assert a.available["host"] == 6 * GiB and b.available["host"] == 2 * GiB
    assert "headroom 6.00 GiB" in b.table()


def test_plan_shows_pinned_bytes_on_cuda(tiny_dir, monkeypatch):
    src = tiny_dir("qwen3_moe")
    shape = read_model_shape(src)
    m = MachineMemory(16 * GiB, 16 * GiB, "test", 8 * GiB, 8 * GiB)
    from freetoken.experts import pinning
    monkeypatch.setattr(pinning, "memlock_limit", lambda: None)
    cfg = EngineConfig(model=str(src), device="cuda", moe_backend="hybrid", expert_cache_slots=4)
    _, plan = make_plan(cfg, shape, m)
    pool = next(i.nbytes for i in plan.items if i.name == "expert pool")
    assert plan.pinned == pool > 0 and plan.to_json()["pinned_bytes"] == pool
    assert "pinned (in place)" in plan.table()
    monkeypatch.setattr(pinning, "memlock_limit", lambda: 64 << 10)      # ulimit -l 64
    _, plan = make_plan(cfg, shape, m)
    assert plan.pinned == 0 and sum("ulimit -l" in w for w in plan.warnings) == 1
    _, plan = make_plan(EngineConfig(model=str(src)), shape, m)            # CPU: nothing pinned
    assert plan.pinned == 0 and "pinned" not in plan.table()
