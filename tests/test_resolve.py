"""memory.resolve: every "auto" and every size made concrete once, logged as one table; the CPU read once."""
from __future__ import annotations

import json
import logging

import pytest
import torch

from freetoken import LLM, SamplingParams, platform
from freetoken.config import EngineConfig
from freetoken.errors import InvalidRequestError
from freetoken.memory import resolve as resolve_module
from freetoken.memory.resolve import resolve


def _model(tmp_path, **config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_resolve_makes_every_auto_concrete(monkeypatch, tmp_path, tiny_dir):
    monkeypatch.setenv("FREETOKEN_SPIN_US", "50")
    src = str(tiny_dir("qwen3_moe"))
    r = resolve(EngineConfig(model=src, device="cpu", dtype="float32", max_model_len=4096))
    assert (r.device, r.dtype, r.compute_dtype, r.max_model_len, r.spin_us) == \
        (torch.device("cpu"), torch.float32, torch.float32, 4096, 50)
    assert (r.moe_backend, r.expert_tier, r.kv_block_size) == ("cpu", "ram", 16) and r.kv_blocks > 1
    assert r.plan is not None and r.plan.kv_blocks == r.kv_blocks
    # a config the plan does not understand: the options as they are, the checkpoint's window
    odd = _model(tmp_path, max_position_embeddings=10**6)
    monkeypatch.setattr(resolve_module, "read_model_shape", lambda path: {"hidden_size": "wide"})
    monkeypatch.setattr(resolve_module, "make_plan", lambda cfg, shape, m: int(shape["hidden_size"]))
    u = resolve(EngineConfig(model=odd))
    assert "config not understood" in u.plan.warnings[0]
    assert (u.max_model_len, u.kv_blocks, u.moe_backend) == (32768, None, None)
    assert resolve(EngineConfig(model=odd, max_model_len=100)).max_model_len == 100


def test_bad_spin_env_is_a_clear_error(monkeypatch, tiny_dir):
    monkeypatch.setenv("FREETOKEN_SPIN_US", "fast")
    with pytest.raises(InvalidRequestError, match="FREETOKEN_SPIN_US"):
        resolve(EngineConfig(model=str(tiny_dir("qwen3_moe"))))


def test_engine_logs_one_table_with_the_backend(tiny_dir, caplog):
    with caplog.at_level(logging.INFO, logger="freetoken.engine"):
        llm = LLM(str(tiny_dir("qwen3_moe")), dtype="float32", moe_backend="hybrid", expert_cache_slots=3)
    assert llm.engine.settings.moe_backend == "hybrid" and llm.engine.settings.expert_cache_slots == 3
    table = [r.getMessage() for r in caplog.records if "resolved settings" in r.getMessage()]
    assert len(table) == 1
    for row in ("device", "compute_dtype", "max_model_len", "spin_us", "moe_backend", "expert_cache_slots", "kv_blocks"):
        assert row in table[0]


def test_cpuinfo_is_read_once():
    platform.cpu_info.cache_clear()
    platform.cpu_flags(), platform.cpu_model(), platform.cpu_signature(), platform.cpu_has_fast_bf16()
    assert platform.cpu_info.cache_info().misses == 1


def test_engine_loader_and_backend_build_what_resolve_decided(tiny_dir, monkeypatch):
    """One decision: on a machine too small for the pool the plan turns the disk tier on; the
    loader builds that tier with the plan's host cache, the engine allocates the plan's KV
    blocks and prefill chunk -- nothing downstream decides again."""
    from freetoken.memory.probe import MachineMemory
    src = str(tiny_dir("qwen3_moe"))
    opts = dict(dtype="float32", max_model_len=64, kv_cache_gib=0.001, memory_headroom_gib=0.0)
    big = resolve(EngineConfig(model=src, **opts), machine=MachineMemory(2**36, 2**35, "test")).plan
    need = sum(i.nbytes for i in big.items if i.name in ("dense weights",)) + \
        next(i.nbytes for i in big.items if i.name == "expert pool") // 2
    monkeypatch.setattr(resolve_module, "probe", lambda *a: MachineMemory(need, need, "test"))
    llm = LLM(src, **opts)
    e = llm.engine
    assert e.settings.expert_tier == "disk" and e.memory_plan.options["expert_tier"] == "disk"
    assert llm.expert_stats()["host_cache"]["slots"] == e.settings.host_cache_slots == \
        e.memory_plan.options["host_cache_slots"]
    assert e.blocks.num_blocks == e.settings.kv_blocks == e.memory_plan.kv_blocks
    assert e.scheduler.budget == e.settings.max_num_batched_tokens
    out = llm.generate(["hello world"], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))[0]
    assert len(out.token_ids) == 4
    llm.close()


def test_hybrid_cache_is_the_planned_size(tiny_dir):
    llm = LLM(str(tiny_dir("qwen3_moe")), dtype="float32", moe_backend="hybrid", expert_cache_gib=1e-4)
    s = llm.engine.settings
    assert s.moe_backend == "hybrid" and s.expert_cache_slots == llm.engine.memory_plan.options["expert_cache_slots"]
    assert llm.engine.model.experts.cache_size()["slots"] == s.expert_cache_slots
    llm.close()
