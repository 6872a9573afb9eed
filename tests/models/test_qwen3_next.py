"""Qwen3-Next against transformers: gated DeltaNet + gated attention hybrid."""
from __future__ import annotations

import transformers

from helpers import assert_logits_close, reference_logits, save_hf_checkpoint
from model_checks import (
    check_batch_equals_single,
    check_prefix_cache_exact,
    check_incremental_equals_full,
    check_snapshot_restore_equals_recompute,
    check_state_position_guard,
    ids_for,
)
from freetoken import LLM


def tiny(tiny_dir, **kw):
    """make-tiny's qwen3_next, with weights large enough that a wrong recurrent state shows in the logits."""
    return tiny_dir("qwen3_next", initializer_range=0.2, **kw)


def test_logits_match_transformers(tiny_dir):
    d = tiny(tiny_dir, layers=4)
    ids = ids_for(70)                     # > one 64-token DeltaNet chunk
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), reference_logits(d, ids))


def test_config_variant_matches_transformers(tiny_dir, tmp_path):
    """Default 3:1 layer pattern via full_attention_interval, mlp_only layer, attention biases,
    tied embeddings, grouped value heads (4 v per k head), norm_topk_prob off."""
    config = transformers.Qwen3NextConfig(
        vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
        head_dim=32, linear_num_key_heads=1, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=8, linear_conv_kernel_dim=3, num_experts=6, num_experts_per_tok=3,
        moe_intermediate_size=24, shared_expert_intermediate_size=40, intermediate_size=48, mlp_only_layers=[2],
        attention_bias=True, tie_word_embeddings=True, norm_topk_prob=False, initializer_range=0.08,
        rope_parameters={"rope_type": "default", "rope_theta": 5000.0, "partial_rotary_factor": 0.5},
        eos_token_id=2, pad_token_id=0)
    d = save_hf_checkpoint(config, tmp_path / "qn", tiny_dir("qwen3_moe"))
    ids = ids_for(23, seed=3)
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), reference_logits(d, ids))


def test_incremental_decode_equals_full_forward(tiny_dir):
    check_incremental_equals_full(tiny(tiny_dir))


def test_batch_equals_single(tiny_dir):
    check_batch_equals_single(tiny(tiny_dir))


def test_snapshot_restore_equals_recompute(tiny_dir):
    check_snapshot_restore_equals_recompute(tiny(tiny_dir))


def test_state_position_guard(tiny_dir):
    check_state_position_guard(tiny(tiny_dir))


def test_only_full_attention_layers_hold_kv(tiny_dir):
    llm = LLM(str(tiny(tiny_dir, layers=4)), dtype="float32")
    assert sorted(llm.engine.runner.kv) == [1, 3]
    st = llm.engine.model.make_state()
    assert st.nbytes == st.parts["deltanet"].conv.nbytes + st.parts["deltanet"].rec.nbytes


def test_bfloat16_close_to_float32(tiny_dir):
    # a bf16 checkpoint: the two runs differ only in how they compute, not in rounded weights
    # (this chaotic random model turns weight rounding alone into 35% logit changes, and so does
    # rounding activations to bf16, which compute_dtype="auto" may choose on AVX512-BF16/AMX CPUs
    # for speed: fp32 activations here; those kernels have their own float64 checks)
    d = str(tiny(tiny_dir, dtype="bfloat16"))
    ids = ids_for(20, seed=2)
    f32 = LLM(d, dtype="float32").score(ids)
    bf16 = LLM(d, dtype="bfloat16", compute_dtype="float32").score(ids)
    assert (bf16 - f32).abs().max() < 0.05 * max(1.0, f32.abs().max().item())


def test_prefix_cache_serves_the_same_logits(tiny_dir):
    check_prefix_cache_exact(tiny(tiny_dir))
