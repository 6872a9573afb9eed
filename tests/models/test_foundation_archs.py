"""Our model code against transformers' reference implementation, per architecture and
per config field that changes the math."""
from __future__ import annotations

import pytest
import torch
import transformers

from freetoken import LLM, SamplingParams

from helpers import ARCHS, assert_logits_close, reference_logits, save_hf_checkpoint, top2_margin
from model_checks import check_batch_equals_single, check_incremental_equals_full, check_prefix_cache_exact, ids_for


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers(tiny_dir, arch):
    d = tiny_dir(arch)
    ids = ids_for(37)
    ours = LLM(str(d), dtype="float32").score(ids)
    assert ours.shape == (37, 512) and ours.dtype == torch.float32
    assert_logits_close(ours, reference_logits(d, ids))


# Config variations that change the math, each written by transformers' config class.
VARIANTS = {
    "qwen3_sparse_step_mlp_only_norm": ("Qwen3MoeConfig", dict(
        decoder_sparse_step=2, mlp_only_layers=[3], norm_topk_prob=False, num_hidden_layers=4,
        moe_intermediate_size=24, intermediate_size=80, num_experts=6, num_experts_per_tok=3, head_dim=16)),
    "qwen3_tied_yarn_bias": ("Qwen3MoeConfig", dict(
        tie_word_embeddings=True, attention_bias=True, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        head_dim=16, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                      "original_max_position_embeddings": 1024})),
    "qwen3_linear_rope": ("Qwen3MoeConfig", dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16,
        rope_parameters={"rope_type": "linear", "rope_theta": 5000.0, "factor": 2.0})),
    "mixtral_llama3_rope": ("MixtralConfig", dict(
        num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "qwen2_sparse_step": ("Qwen2MoeConfig", dict(
        decoder_sparse_step=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, intermediate_size=80, norm_topk_prob=True)),
    "olmoe_clip_qkv": ("OlmoeConfig", dict(clip_qkv=0.05, num_experts=4, num_experts_per_tok=2, intermediate_size=32,
                                           norm_topk_prob=True)),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_config_variants_match_transformers(tiny_dir, tmp_path, name):
    cls, kw = VARIANTS[name]
    base = dict(vocab_size=512, hidden_size=64, num_hidden_layers=kw.pop("num_hidden_layers", 2),
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                eos_token_id=2, pad_token_id=0, bos_token_id=None)
    config = getattr(transformers, cls)(**base, **kw)
    d = save_hf_checkpoint(config, tmp_path / name, tiny_dir("qwen3_moe"), max_shard_size="100KB")
    assert (d / "model.safetensors.index.json").exists(), "variant should exercise sharded loading"
    ids = ids_for(29, seed=3)
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), reference_logits(d, ids))


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_decode_equals_full_forward(tiny_dir, arch):
    check_incremental_equals_full(tiny_dir(arch))


@pytest.mark.parametrize("arch", ARCHS)
def test_batch_equals_single(tiny_dir, arch):
    check_batch_equals_single(tiny_dir(arch))


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_agrees_with_transformers_where_margins_allow(tiny_dir, arch):
    d = tiny_dir(arch)
    prompt = ids_for(9, seed=11)
    ref = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    with torch.no_grad():
        theirs = ref.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    ours = LLM(str(d), dtype="float32").generate([prompt], SamplingParams(max_tokens=10, temperature=0.0,
                                                                          ignore_eos=True))[0].token_ids
    # Compare up to the first position where the reference's top-2 margin is a near-tie.
    logits = reference_logits(d, prompt + theirs)[len(prompt) - 1:]
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if top2_margin(logits[i]) < 1e-4:
            break
        assert a == b, f"token {i}: ours {a} vs transformers {b} (margin {top2_margin(logits[i]):.3g})"


def test_bfloat16_close_to_float32(tiny_dir):
    d = str(tiny_dir("qwen3_moe"))
    ids = ids_for(20, seed=2)
    f32 = LLM(d, dtype="float32").score(ids)
    bf16 = LLM(d, dtype="bfloat16").score(ids)
    assert bf16.dtype == torch.float32
    assert (bf16 - f32).abs().max() < 0.05 * max(1.0, f32.abs().max().item())


@pytest.mark.parametrize("arch", ARCHS)
def test_prefix_cache_serves_the_same_logits(tiny_dir, arch):
    check_prefix_cache_exact(tiny_dir(arch))
