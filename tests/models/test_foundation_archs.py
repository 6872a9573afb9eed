"""Our model code against transformers' reference implementation, per architecture and
per config field that changes the math."""
from __future__ import annotations

import pytest
import torch
import transformers

from freetoken import LLM, SamplingParams

from helpers import ARCHS, assert_logits_close, reference_logits, save_hf_checkpoint, top2_margin


def _ids(n, seed=0, vocab=500):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers(tiny_dir, arch):
    d = tiny_dir(arch)
    ids = _ids(37)
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
    ids = _ids(29, seed=3)
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), reference_logits(d, ids))


def _capture():
    seen = []

    def proc(out_ids, logits):
        seen.append(logits.clone())
        return logits
    return seen, proc


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_decode_equals_full_forward(tiny_dir, arch):
    llm = LLM(str(tiny_dir(arch)), dtype="float32")
    prompt = _ids(11, seed=5)
    seen, proc = _capture()
    out = llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0.0, logits_processors=[proc],
                                                ignore_eos=True))[0]
    full = llm.score(prompt + out.token_ids)
    decoded = torch.stack(seen)                       # logits at each step, computed incrementally
    assert_logits_close(decoded, full[len(prompt) - 1: len(prompt) - 1 + len(seen)])


@pytest.mark.parametrize("arch", ARCHS)
def test_batch_equals_single(tiny_dir, arch):
    d = str(tiny_dir(arch))
    prompts = [_ids(n, seed=n) for n in (5, 17, 9, 30)]
    params = dict(max_tokens=8, temperature=0.0, ignore_eos=True)
    batched_llm = LLM(d, dtype="float32", max_num_batched_tokens=40)   # forces chunked prefill alongside decode
    caps = [_capture() for _ in prompts]
    for (seen, proc), p in zip(caps, prompts):
        batched_llm.engine.add_request(f"r{len(seen)}-{id(proc)}", p, SamplingParams(logits_processors=[proc], **params))
    while batched_llm.engine.has_unfinished():
        batched_llm.engine.step()
    single_llm = LLM(d, dtype="float32")
    for (seen_b, _), p in zip(caps, prompts):
        seen_s, proc = _capture()
        single_llm.generate([p], SamplingParams(logits_processors=[proc], **params))
        assert len(seen_b) == len(seen_s) == 8
        assert_logits_close(torch.stack(seen_b), torch.stack(seen_s))


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_agrees_with_transformers_where_margins_allow(tiny_dir, arch):
    d = tiny_dir(arch)
    prompt = _ids(9, seed=11)
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
    ids = _ids(20, seed=2)
    f32 = LLM(d, dtype="float32").score(ids)
    bf16 = LLM(d, dtype="bfloat16").score(ids)
    assert bf16.dtype == torch.float32
    assert (bf16 - f32).abs().max() < 0.05 * max(1.0, f32.abs().max().item())
