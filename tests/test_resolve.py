"""EngineConfig.resolve: every "auto" made concrete once, logged as one table; the CPU read once."""
from __future__ import annotations

import logging

import pytest
import torch

from freetoken import LLM, platform
from freetoken.config import EngineConfig
from freetoken.errors import InvalidRequestError


def test_resolve_makes_every_auto_concrete(monkeypatch):
    monkeypatch.setenv("FREETOKEN_SPIN_US", "50")
    r = EngineConfig(model="m", device="cpu", dtype="float32").resolve({"max_position_embeddings": 4096})
    assert (r.device, r.dtype, r.compute_dtype, r.max_model_len, r.spin_us) == \
        (torch.device("cpu"), torch.float32, torch.float32, 4096, 50)
    assert EngineConfig(model="m", max_model_len=100).resolve({}).max_model_len == 100
    assert EngineConfig(model="m").resolve({"max_position_embeddings": 10**6}).max_model_len == 32768


def test_bad_spin_env_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("FREETOKEN_SPIN_US", "fast")
    with pytest.raises(InvalidRequestError, match="FREETOKEN_SPIN_US"):
        EngineConfig(model="m").resolve({})


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
