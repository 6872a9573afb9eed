"""Dense decoders (Llama/SmolLM2, Mistral, Qwen2, Qwen3, Gemma 3) against transformers on tiny
random checkpoints written by transformers' own config classes, plus the engine paths a MoE
model takes (incremental decode, batching, prefix cache): a dense model never builds experts."""
from __future__ import annotations

import pytest
import torch
import transformers

from freetoken import LLM

from helpers import assert_logits_close, reference_logits, save_hf_checkpoint
from model_checks import check_batch_equals_single, check_incremental_equals_full, check_prefix_cache_exact, ids_for

# Gemma 3 slides five layers in six: six layers have both kinds
TINY = {"gemma3": dict(layers=6)}
DENSE = ["llama", "mistral", "qwen2", "qwen3", "gemma3"]


@pytest.mark.parametrize("arch", DENSE)
def test_logits_match_transformers(tiny_dir, arch):
    d = tiny_dir(arch, **TINY.get(arch, {}))
    ids = ids_for(37)
    llm = LLM(str(d), dtype="float32")
    assert llm.engine.model.experts is None and llm.engine.model.moe_layers == []
    assert_logits_close(llm.score(ids), reference_logits(d, ids))


@pytest.mark.parametrize("arch", DENSE)
def test_incremental_decode_equals_full_forward(tiny_dir, arch):
    check_incremental_equals_full(tiny_dir(arch, **TINY.get(arch, {})))


@pytest.mark.parametrize("arch", ["llama", "mistral", "gemma3"])
def test_batch_equals_single(tiny_dir, arch):
    check_batch_equals_single(tiny_dir(arch, **TINY.get(arch, {})))


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_prefix_cache_exact(tiny_dir, arch):
    check_prefix_cache_exact(tiny_dir(arch, **TINY.get(arch, {})))


VARIANTS = {
    # SmolLM2's shape: tied embeddings, one kv head per three query heads, no head_dim field
    "llama_tied_gqa": ("LlamaConfig", dict(tie_word_embeddings=True, num_attention_heads=6, num_key_value_heads=2,
                                           hidden_size=96, intermediate_size=160)),
    "llama_bias_llama3_rope": ("LlamaConfig", dict(
        attention_bias=True, intermediate_size=80,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "qwen2_tied_window_off": ("Qwen2Config", dict(tie_word_embeddings=True, intermediate_size=80,
                                                  use_sliding_window=False)),
    "qwen3_tied_bias": ("Qwen3Config", dict(tie_word_embeddings=True, attention_bias=True, head_dim=32,
                                            intermediate_size=80)),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_config_variants_match_transformers(tiny_dir, tmp_path, name):
    cls, kw = VARIANTS[name]
    base = dict(vocab_size=512, hidden_size=kw.pop("hidden_size", 64), num_hidden_layers=2,
                num_attention_heads=kw.pop("num_attention_heads", 4), num_key_value_heads=kw.pop("num_key_value_heads", 2),
                max_position_embeddings=2048, eos_token_id=2, pad_token_id=0, bos_token_id=None)
    config = getattr(transformers, cls)(**base, **kw)
    d = save_hf_checkpoint(config, tmp_path / name, tiny_dir("llama"))
    ids = ids_for(29, seed=3)
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), reference_logits(d, ids))


def test_dense_engine_reports_no_experts(tiny_dir):
    """The engine's expert stats and the web page's view say "dense model", nothing pretends."""
    llm = LLM(str(tiny_dir("llama")), dtype="float32")
    stats = llm.engine.expert_stats()
    assert stats.get("dense") is True and not stats.get("backend")
    out = llm.generate([ids_for(5)], None)[0]
    assert len(out.token_ids) > 0
