"""MiniMax-M2 (MiniMaxM2ForCausalLM) against transformers, per config field that changes the math,
through the engine's paged-KV prefill and decode, the prefix cache and the tiered expert backends."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers

from freetoken import LLM, SamplingParams

from helpers import assert_logits_close, reference_logits, save_hf_checkpoint
from model_checks import check_batch_equals_single, check_incremental_equals_full, check_prefix_cache_exact, ids_for


def tiny(tiny_dir, **kw):
    """make-tiny's minimax_m2: q/k norm over the projection, rotary over half the head (rotary_dim),
    sigmoid routing with random correction biases."""
    return tiny_dir("minimax_m2", layers=3, **kw)


def test_logits_match_transformers(tiny_dir):
    d = tiny(tiny_dir)
    ids = ids_for(41)
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), reference_logits(d, ids))


def test_incremental_decode_equals_full_forward(tiny_dir):
    check_incremental_equals_full(tiny(tiny_dir))


def test_batch_equals_single(tiny_dir):
    check_batch_equals_single(tiny(tiny_dir))


def test_prefix_cache_serves_the_same_logits(tiny_dir):
    check_prefix_cache_exact(tiny(tiny_dir))


VARIANTS = {
    # 16 experts, top-3, GQA 8:2
    "experts16_top3_gqa4": dict(num_local_experts=16, num_experts_per_tok=3, num_attention_heads=8,
                                num_key_value_heads=2, head_dim=8, rotary_dim=4),
    "full_rotary_tied": dict(rotary_dim=16, tie_word_embeddings=True),
    "yarn": dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                  "original_max_position_embeddings": 1024, "partial_rotary_factor": 0.25}),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_config_variants_match_transformers(tiny_dir, tmp_path, name):
    kw = dict(vocab_size=512, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, intermediate_size=24, num_local_experts=8, num_experts_per_tok=2, rotary_dim=8,
              max_position_embeddings=2048, eos_token_id=2, pad_token_id=0, bos_token_id=None)
    kw.update(VARIANTS[name])
    d = save_hf_checkpoint(transformers.MiniMaxM2Config(**kw), tmp_path / name, tiny(tiny_dir),
                           max_shard_size="100KB", random_selection_bias=True)
    ids = ids_for(33, seed=3)
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), reference_logits(d, ids))


@pytest.mark.parametrize("theta", [5000000, None])
def test_released_config_layout(tiny_dir, tmp_path, theta):
    """MiniMax's own config.json: `rope_theta` and `rotary_dim` at the top, no rope_parameters or
    partial_rotary_factor, plus fields transformers does not read (its model is always sigmoid
    routing with the bias and q/k norm over the projection). Without rope_theta the base is
    MiniMaxM2Config's 5e6."""
    src = tiny(tiny_dir)
    d = tmp_path / "released"
    shutil.copytree(src, d)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["rope_parameters"]
    cfg.update(use_qk_norm=True, qk_norm_type="per_layer", scoring_func="sigmoid",
               use_routing_bias=True, shared_intermediate_size=0, attn_type_list=[1] * cfg["num_hidden_layers"],
               use_mtp=True, num_mtp_modules=3, mtp_transformer_layers=1)
    if theta is not None:
        cfg["rope_theta"] = theta
    (d / "config.json").write_text(json.dumps(cfg))
    ids = ids_for(25, seed=4)
    ours = LLM(str(d), dtype="float32").score(ids)
    assert_logits_close(ours, reference_logits(d, ids))
    assert_logits_close(ours, reference_logits(src, ids))


def test_fp8_checkpoint_matches_transformers(tiny_dir, tmp_path):
    """MiniMax-M2 ships FP8 e4m3 projections and experts with 128x128 block scales, the router
    and lm_head unquantized: experts filling whole 128-row blocks stay packed in fp8 banks."""
    from freetoken.quant.fp8 import quantize_checkpoint_fp8
    from test_deepseek_v3 import dequantized_copy

    d = tmp_path / "fp8"
    shutil.copytree(tiny(tiny_dir, hidden=128, intermediate_size=128, initializer_range=0.05), d)
    quantize_checkpoint_fp8(d, keep=("embed_tokens", "lm_head", "norm", "block_sparse_moe.gate."))
    llm = LLM(str(d), dtype="float32")
    pool = llm.engine.model.pool
    assert pool.spec.fmt == "fp8" and pool.banks["gate_up"].dtype == torch.float8_e4m3fn
    ids = ids_for(30)
    assert_logits_close(llm.score(ids), reference_logits(dequantized_copy(d, tmp_path / "deq"), ids))


def _served(model, **opts):
    llm = LLM(str(model), dtype="float32", **opts)
    try:
        prompt = ids_for(40, seed=9)
        out = llm.generate([prompt, prompt[:7]], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
        return llm.score(prompt), [c.token_ids for c in out]
    finally:
        llm.close()


@pytest.mark.parametrize("backend,slots", [("offload", 3), ("hybrid", 0), ("hybrid", 5), ("cpu", None)])
def test_tiered_backends_match_resident(tiny_dir, backend, slots):
    """The bias-corrected router's choices go through every expert tier unchanged."""
    d = tiny(tiny_dir)
    logits, tokens = _served(d, moe_backend=backend, expert_cache_slots=slots)
    ref_logits, ref_tokens = _served(d, moe_backend="resident")
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=1e-4)
    assert tokens == ref_tokens
