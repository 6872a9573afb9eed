"""DeepSeek-V3 against transformers: MLA over the latent cache (expanded prefill, absorbed
decode), group-limited sigmoid routing with correction bias, shared experts, dense first
layers, YaRN mscale, FP8 block-scaled weights as shipped."""
from __future__ import annotations

import shutil

import pytest
import torch
import transformers

from freetoken import LLM
from freetoken.layers.attention.paged import kv_values_per_token
from freetoken.layers.moe import grouped_sigmoid_topk
from freetoken.quant.fp8 import quantize_checkpoint_fp8

from helpers import assert_logits_close, reference_logits
from model_checks import check_batch_equals_single, check_incremental_equals_full, check_prefix_cache_exact, ids_for

BASE = dict(vocab_size=512, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
            num_experts_per_tok=2, n_group=4, topk_group=2, first_k_dense_replace=1, kv_lora_rank=32,
            q_lora_rank=48, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, eos_token_id=2,
            pad_token_id=0, bos_token_id=None, initializer_range=0.1)

VARIANTS = {
    "base": {},
    # no q LoRA, plain (non-interleaved) rope, YaRN with mscale_all_dim (softmax scale * mscale^2),
    # unnormalised top-k, two shared experts, attention biases, one group (Kimi-K2 style routing)
    "q_proj_yarn_bias": dict(q_lora_rank=None, rope_interleave=False, norm_topk_prob=False, n_shared_experts=2,
                             attention_bias=True, n_group=1, topk_group=1, routed_scaling_factor=1.7,
                             rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                              "original_max_position_embeddings": 64, "mscale": 0.8,
                                              "mscale_all_dim": 0.8, "beta_fast": 32, "beta_slow": 1}),
    "all_dense_start": dict(first_k_dense_replace=2, n_group=2, topk_group=1, num_experts_per_tok=3),
}


def build(tiny_dir, tmp_path, name, fp8=False, **kw):
    config = transformers.DeepseekV3Config(**{**BASE, **VARIANTS.get(name, {}), **kw})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    for n, buf in model.named_buffers():       # zeros at init: a bias that changes the choice
        if n.endswith("e_score_correction_bias"):
            buf.uniform_(-0.05, 0.05)
    out = tmp_path / name
    model.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny_dir("qwen3_moe") / f, out / f)
    if fp8:
        quantize_checkpoint_fp8(out)
    return out


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_logits_match_transformers(tiny_dir, tmp_path, name):
    d = build(tiny_dir, tmp_path, name)
    ids = ids_for(41)
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), reference_logits(d, ids))


def test_fp8_checkpoint_matches_transformers(tiny_dir, tmp_path):
    """Projections, dense MLPs, shared and routed experts in e4m3 with 128x128 block scales:
    experts (128 rows) stay packed in fp8 banks, the dense gate/up pair (96 rows, not whole
    blocks) is dequantized at load; transformers dequantizes everything on the CPU."""
    d = build(tiny_dir, tmp_path, "fp8", fp8=True, hidden_size=128, moe_intermediate_size=128)
    llm = LLM(str(d), dtype="float32")
    assert llm.engine.model.pool.spec.fmt == "fp8"
    assert llm.engine.model.layers[1].attn.q_b.weight.dtype == torch.float8_e4m3fn
    ids = ids_for(33)
    assert_logits_close(llm.score(ids), reference_logits(dequantized_copy(d, tmp_path / "deq"), ids))


def dequantized_copy(d, out):
    """The FP8 checkpoint dequantized by transformers' own block dequantizer (its FP8 loader
    needs accelerate, which the test environment does not carry)."""
    import json

    from safetensors.torch import load_file, save_file
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

    shutil.copytree(d, out)
    t = load_file(str(out / "model.safetensors"))
    deq = {n: (_dequantize_fp8_weight(w, t[n + "_scale_inv"], [128, 128], torch.float32)
               if n + "_scale_inv" in t else w) for n, w in t.items() if not n.endswith("_scale_inv")}
    save_file(deq, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    del cfg["quantization_config"]
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.mark.parametrize("name", ["base", "q_proj_yarn_bias"])
def test_absorbed_decode_equals_expanded_full_forward(tiny_dir, tmp_path, name):
    check_incremental_equals_full(build(tiny_dir, tmp_path, name), prompt_len=11, steps=14)


def test_batch_equals_single(tiny_dir, tmp_path):
    check_batch_equals_single(build(tiny_dir, tmp_path, "base"))


def test_latent_cache_bytes_per_token(tiny_dir, tmp_path):
    """One row of kv_lora_rank + qk_rope_head_dim values per token and layer, no V."""
    d = build(tiny_dir, tmp_path, "base")
    llm = LLM(str(d), dtype="float32", kv_cache_gib=0.001)
    model, runner = llm.engine.model, llm.engine.runner
    assert kv_values_per_token(model.kv_layers()) == 3 * (32 + 8)
    slots = next(iter(runner.kv.values())).k.shape[0]
    assert runner.kv_nbytes == slots * 3 * (32 + 8) * 4
    assert all(c.v is None for c in runner.kv.values())


def test_group_limited_routing_matches_transformers_router():
    torch.manual_seed(1)
    cfg = transformers.DeepseekV3Config(**{**BASE, "n_routed_experts": 16, "n_group": 4, "topk_group": 2,
                                          "num_experts_per_tok": 4, "hidden_size": 32})
    ref = transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3TopkRouter(cfg)
    torch.nn.init.normal_(ref.weight, std=0.5)
    ref.e_score_correction_bias.uniform_(-0.3, 0.3)
    x = torch.randn(50, 32)
    with torch.no_grad():
        logits, w_ref, ids_ref = ref(x)
    ids, w = grouped_sigmoid_topk(logits, ref.e_score_correction_bias, 4, 4, 2, True, cfg.routed_scaling_factor)
    order_ref, order = ids_ref.sort(-1), ids.sort(-1)
    assert torch.equal(order_ref.values, order.values)
    torch.testing.assert_close(w_ref.gather(1, order_ref.indices), w.gather(1, order.indices))


def test_make_tiny_deepseek_v3(tiny_dir):
    d = tiny_dir("deepseek_v3", layers=3)
    ids = ids_for(20)
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), reference_logits(d, ids))


def test_prefix_cache_exact(tiny_dir, tmp_path):
    check_prefix_cache_exact(build(tiny_dir, tmp_path, "base"))
