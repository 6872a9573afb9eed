"""A default lives in one place (freetoken/defaults.py): changed there, the memory plan, the
engine's allocation and the CLI help all follow it."""
from __future__ import annotations

import argparse

from freetoken import LLM, defaults
from freetoken.engine.args import add_engine_args

MiB = 1 << 20


def test_the_kv_default_moves_plan_allocation_and_help_together(tiny_dir, monkeypatch):
    cap_gib = 8 * MiB / (1 << 30)              # far below max_num_seqs x max_model_len of this model
    monkeypatch.setattr(defaults, "KV_CACHE_GIB", cap_gib)
    llm = LLM(str(tiny_dir("qwen3_moe")), dtype="float32", max_model_len=4096)
    try:
        eng = llm.engine
        bs = eng.blocks.block_size
        per_token = eng.runner.kv_nbytes // (eng.blocks.num_blocks * bs)     # measured on the allocation
        assert (eng.blocks.num_blocks - 2) * bs * per_token < 8 * MiB <= (eng.blocks.num_blocks - 1) * bs * per_token
        kv = next(i for i in eng.memory_plan.items if i.name == "KV cache")
        assert kv.nbytes == eng.runner.kv_nbytes and f"default cap {cap_gib:g} GiB" in kv.note
        assert eng.memory_plan.kv_blocks == eng.blocks.num_blocks
    finally:
        llm.close()
    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert f"at most {cap_gib:g} GiB" in " ".join(p.format_help().split())
