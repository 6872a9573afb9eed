"""GLM-4.5 / 4.6 / 4.7 (Glm4MoeForCausalLM) against transformers, per config field that changes the math."""
from __future__ import annotations

import json

import pytest
import torch
import transformers

from freetoken import LLM

from helpers import assert_logits_close, reference_logits, save_hf_checkpoint
from model_checks import check_batch_equals_single, check_incremental_equals_full, ids_for


def tiny(tiny_dir, **kw):
    """make-tiny's glm4_moe: layer 0 dense, then MoE layers with 2 expert groups, qk norm, scaling 2.5."""
    return tiny_dir("glm4_moe", layers=3, **kw)


def test_logits_match_transformers(tiny_dir):
    d = tiny(tiny_dir)
    ids = ids_for(41)
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), reference_logits(d, ids))


def test_incremental_decode_equals_full_forward(tiny_dir):
    check_incremental_equals_full(tiny(tiny_dir))


def test_batch_equals_single(tiny_dir):
    check_batch_equals_single(tiny(tiny_dir))


VARIANTS = {
    # GLM-4.5-Air-like: no qk norm, one group, q/k/v biases, two dense layers, unnormalised top-k
    "no_qk_norm_bias_dense2": dict(use_qk_norm=False, attention_bias=True, first_k_dense_replace=2,
                                   n_group=1, topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.0),
    # 4 groups of 4 experts, 2 groups eligible, top-3, two shared experts, GQA 8:2
    "groups_shared2": dict(n_routed_experts=16, num_experts_per_tok=3, n_group=4, topk_group=2,
                           n_shared_experts=2, num_attention_heads=8, num_key_value_heads=2),
    "yarn_full_rotary": dict(partial_rotary_factor=1.0, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 1024,
        "partial_rotary_factor": 1.0}),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_config_variants_match_transformers(tiny_dir, tmp_path, name):
    kw = dict(vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, intermediate_size=96, moe_intermediate_size=24, n_routed_experts=8,
              num_experts_per_tok=2, n_group=2, topk_group=1, routed_scaling_factor=2.0, use_qk_norm=True,
              max_position_embeddings=2048, eos_token_id=2, pad_token_id=0, bos_token_id=None)
    kw.update(VARIANTS[name])
    config = transformers.Glm4MoeConfig(**kw)
    d = save_hf_checkpoint(config, tmp_path / name, tiny(tiny_dir), max_shard_size="100KB",
                           random_selection_bias=True)
    ids = ids_for(33, seed=3)
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), reference_logits(d, ids))


def test_partial_rotary_defaults_to_half_when_absent(tiny_dir, tmp_path):
    """Real GLM configs may omit the factor; GLM's config class then implies 0.5."""
    src = tiny(tiny_dir)
    d = tmp_path / "no_factor"
    d.mkdir()
    for f in src.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("partial_rotary_factor", None)
    cfg["rope_parameters"].pop("partial_rotary_factor")
    (d / "config.json").write_text(json.dumps(cfg))
    ids = ids_for(25, seed=4)
    ours = LLM(str(d), dtype="float32").score(ids)
    assert_logits_close(ours, reference_logits(d, ids))
    assert_logits_close(ours, reference_logits(src, ids))


LITE = dict(vocab_size=512, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
            num_experts_per_tok=2, n_group=2, topk_group=1, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8,
            qk_nope_head_dim=16, v_head_dim=16, routed_scaling_factor=1.8, eos_token_id=2, pad_token_id=0,
            bos_token_id=None, initializer_range=0.1)


@pytest.mark.parametrize("kw", [{}, dict(mlp_layer_types=["sparse", "dense", "sparse"], q_lora_rank=None,
                                         rope_interleave=False)])
def test_glm4_7_flash_lite_matches_transformers(tiny_dir, tmp_path, kw):
    """GLM-4.7-Flash: MLA (DeepSeek-V3's) under GLM's MoE."""
    config = transformers.Glm4MoeLiteConfig(**{**LITE, **kw})
    d = save_hf_checkpoint(config, tmp_path / "lite", tiny(tiny_dir), random_selection_bias=True)
    ids = ids_for(37, seed=6)
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), reference_logits(d, ids))
    if not kw:
        check_incremental_equals_full(d)


def test_fp8_checkpoint_matches_transformers(tiny_dir, tmp_path):
    """GLM-4.5-FP8 style (e4m3 weights, 128x128 block scales): every FP8 tensor is read with its
    scales, never as raw e4m3 values."""
    import shutil

    from freetoken.quant.fp8 import quantize_checkpoint_fp8
    from test_deepseek_v3 import dequantized_copy

    d = tmp_path / "fp8"
    shutil.copytree(tiny(tiny_dir), d)
    quantize_checkpoint_fp8(d)
    ids = ids_for(30)
    ref = reference_logits(dequantized_copy(d, tmp_path / "deq"), ids)
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), ref)


def test_fp8_experts_stay_packed(tiny_dir, tmp_path):
    """GLM-4.5-FP8 routed experts whose intermediate size fills whole 128-row blocks are kept in
    fp8 banks with their block scales (no dequantized copy), and match transformers."""
    import shutil

    from freetoken.quant.fp8 import quantize_checkpoint_fp8
    from test_deepseek_v3 import dequantized_copy

    d = tmp_path / "fp8"
    shutil.copytree(tiny_dir("glm4_moe", layers=3, hidden=128, moe_intermediate_size=128, initializer_range=0.05), d)
    quantize_checkpoint_fp8(d)
    llm = LLM(str(d), dtype="float32")
    pool = llm.engine.model.pool
    assert pool.spec.fmt == "fp8" and pool.banks["gate_up"].dtype == torch.float8_e4m3fn
    assert pool.banks["gate_up_scale_inv"].shape[1:] == (2, 1)          # [2I/128, H/128] per expert
    ids = ids_for(30)
    ref = reference_logits(dequantized_copy(d, tmp_path / "deq"), ids)
    assert_logits_close(llm.score(ids), ref)
