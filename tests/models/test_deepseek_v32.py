"""DeepSeek-V3.2 against transformers: DSA's lightning indexer picks index_topk keys per
query over the latent cache (prompts several times longer than index_topk, so every
later query is sparse); its keys live at the end of each latent row."""
from __future__ import annotations

import shutil

import pytest
import torch
import transformers

from freetoken import LLM
from freetoken.layers.attention.paged import kv_values_per_token

from helpers import assert_logits_close, reference_logits
from model_checks import check_batch_equals_single, check_incremental_equals_full, check_prefix_cache_exact, ids_for

BASE = dict(vocab_size=512, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
            num_experts_per_tok=2, n_group=4, topk_group=2, first_k_dense_replace=1, kv_lora_rank=32,
            q_lora_rank=48, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, eos_token_id=2,
            pad_token_id=0, bos_token_id=None, initializer_range=0.1, index_topk=8, index_head_dim=16,
            index_n_heads=8)


def build(tiny_dir, tmp_path, name="v32", **kw):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.DeepseekV32Config(**{**BASE, **kw}))
    for n, buf in model.named_buffers():
        if n.endswith("e_score_correction_bias"):
            buf.uniform_(-0.05, 0.05)
    out = tmp_path / name
    model.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny_dir("qwen3_moe") / f, out / f)
    return out


@pytest.mark.parametrize("kw", [{}, dict(index_topk=5, mlp_layer_types=["sparse", "dense", "sparse"],
                                         rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0,
                                                          "original_max_position_embeddings": 64,
                                                          "mscale": 1.0, "mscale_all_dim": 1.0})])
def test_logits_match_transformers(tiny_dir, tmp_path, kw):
    d = build(tiny_dir, tmp_path, **kw)
    ids = ids_for(45)
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), reference_logits(d, ids))


def test_sparse_selection_changes_the_result(tiny_dir, tmp_path):
    """The same model attending every key is far from the reference: the top-k path is live."""
    d = build(tiny_dir, tmp_path)
    ids = ids_for(45)
    llm = LLM(str(d), dtype="float32")
    for layer in llm.engine.model.layers:
        layer.attn.indexer.topk = 10 ** 6
    dense = llm.score(ids)
    ref = reference_logits(d, ids)
    assert (dense - ref).abs().max() > 1e-2 * ref.abs().max()


def test_sparse_decode_equals_full_forward(tiny_dir, tmp_path):
    """Absorbed decode reads only the indexer's top-k rows (C kernel on the CPU)."""
    check_incremental_equals_full(build(tiny_dir, tmp_path), prompt_len=13, steps=14)


def test_batch_equals_single(tiny_dir, tmp_path):
    check_batch_equals_single(build(tiny_dir, tmp_path))


def test_cache_row_holds_latent_rope_and_indexer_key(tiny_dir, tmp_path):
    llm = LLM(str(build(tiny_dir, tmp_path)), dtype="float32", kv_cache_gib=0.001)
    assert kv_values_per_token(llm.engine.model.kv_layers()) == 3 * (32 + 8 + 16)
    assert all(c.v is None and c.k.shape[1:] == (1, 56) for c in llm.engine.runner.kv.values())


def test_make_tiny_deepseek_v32(tiny_dir):
    d = tiny_dir("deepseek_v32", layers=3)
    ids = ids_for(30)
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), reference_logits(d, ids))


def test_prefix_cache_exact(tiny_dir, tmp_path):
    check_prefix_cache_exact(build(tiny_dir, tmp_path))
