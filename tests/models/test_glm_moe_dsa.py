"""GLM-5 (GlmMoeDsaForCausalLM) against transformers: MLA + DSA with an interleaved-rope
indexer, "shared" layers that reuse the previous full layer's top-k, prompts several times
longer than index_topk so every later query is sparse."""
from __future__ import annotations

import json

import pytest
import torch
import transformers

from freetoken import LLM
from freetoken.errors import CheckpointError
from freetoken.layers.attention.paged import kv_values_per_token
from freetoken.models.glm.glm_moe_dsa import indexer_types

from helpers import assert_logits_close, reference_logits, save_hf_checkpoint
from model_checks import check_batch_equals_single, check_incremental_equals_full, ids_for

BASE = dict(vocab_size=512, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
            num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1, kv_lora_rank=32,
            q_lora_rank=48, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, eos_token_id=2,
            pad_token_id=0, bos_token_id=None, initializer_range=0.1, index_topk=8, index_head_dim=16,
            index_n_heads=8, routed_scaling_factor=2.5, indexer_types=["full", "shared", "full", "shared"])


def build(tiny_dir, tmp_path, name="glm5", **kw):
    config = transformers.GlmMoeDsaConfig(**{**BASE, **kw})
    return save_hf_checkpoint(config, tmp_path / name, tiny_dir("qwen3_moe"), random_selection_bias=True)


@pytest.mark.parametrize("kw", [{}, dict(index_topk=5, indexer_types=["full", "shared", "shared", "full"],
                                         mlp_layer_types=["sparse", "dense", "sparse", "sparse"]),
                                dict(index_topk_pattern="FFSF", indexer_types=None)])
def test_logits_match_transformers(tiny_dir, tmp_path, kw):
    d = build(tiny_dir, tmp_path, **kw)
    ids = ids_for(45)
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), reference_logits(d, ids))


def test_sparse_selection_is_live_in_shared_layers(tiny_dir, tmp_path):
    """Widening only the full layers' top-k moves the result far from the reference."""
    d = build(tiny_dir, tmp_path)
    ids = ids_for(45)
    llm = LLM(str(d), dtype="float32")
    for layer in llm.engine.model.layers:
        if hasattr(layer.attn.indexer, "topk"):
            layer.attn.indexer.topk = 10 ** 6
    ref = reference_logits(d, ids)
    assert (llm.score(ids) - ref).abs().max() > 1e-2 * ref.abs().max()


def test_sparse_decode_equals_full_forward(tiny_dir, tmp_path):
    check_incremental_equals_full(build(tiny_dir, tmp_path), prompt_len=13, steps=14)


def test_batch_equals_single(tiny_dir, tmp_path):
    check_batch_equals_single(build(tiny_dir, tmp_path))


def test_shared_layers_keep_no_indexer_keys(tiny_dir, tmp_path):
    llm = LLM(str(build(tiny_dir, tmp_path)), dtype="float32", kv_cache_gib=0.001)
    assert kv_values_per_token(llm.engine.model.kv_layers()) == 4 * (32 + 8) + 2 * 16
    widths = [c.k.shape[-1] for _, c in sorted(llm.engine.runner.kv.items())]
    assert widths == [56, 40, 56, 40]


@pytest.mark.parametrize("kw", [dict(), dict(index_topk_freq=3, index_skip_topk_offset=2),
                                dict(index_topk_freq=2, index_skip_topk_offset=1), dict(index_topk_pattern="FSSFSF")])
def test_indexer_schedule_as_glm_config_derives_it(kw):
    ref = transformers.GlmMoeDsaConfig(num_hidden_layers=6, **kw).indexer_types
    assert indexer_types({"num_hidden_layers": 6, **kw}, "config.json") == ref


def test_bad_indexer_types_is_a_clear_error(tiny_dir, tmp_path):
    d = build(tiny_dir, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["indexer_types"] = ["shared", "full", "full", "full"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="indexer_types"):
        LLM(str(d), dtype="float32")


def test_make_tiny_glm_moe_dsa(tiny_dir):
    d = tiny_dir("glm_moe_dsa", layers=4)
    ids = ids_for(30)
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), reference_logits(d, ids))
