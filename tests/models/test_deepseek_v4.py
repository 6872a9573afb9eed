"""DeepSeek-V4 against transformers: sliding window with sinks, CSA (overlapping compressor +
lightning indexer top-k) and HCA compressed branches, grouped low-rank output projection,
hyper-connections with Sinkhorn, hash-routed and sqrt-softplus-routed MoE with clamped SwiGLU.

Prompts are longer than the window (8), than several compress windows (4 and 8) and give
more visible entries than index_topk (3), so every sparse path selects. The reference
initialises sinks, position biases, hyper-connection biases and the hash table to zeros;
here they are random so that each mechanism shows in the logits."""
from __future__ import annotations

import shutil

import pytest
import torch
import transformers

from freetoken import LLM

from helpers import assert_logits_close, exact_experts, reference_logits
from model_checks import (
    check_batch_equals_single,
    check_incremental_equals_full,
    check_prefix_cache_exact,
    check_snapshot_restore_equals_recompute,
    check_state_position_guard,
    ids_for,
)

TYPES = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
         "compressed_sparse_attention"]
BASE = dict(vocab_size=512, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
            head_dim=32, q_lora_rank=48, num_experts_per_tok=2, n_routed_experts=8, sliding_window=8, o_groups=2,
            o_lora_rank=16, index_n_heads=16, index_head_dim=16, index_topk=3,
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
            layer_types=TYPES, mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"], hc_mult=2,
            eos_token_id=2, pad_token_id=0, bos_token_id=None, partial_rotary_factor=0.25, initializer_range=0.1,
            swiglu_limit=0.5)


def randomize(model, seed=1):
    """Give the zero/one-initialised parameters values that matter (see the module docstring)."""
    g = torch.Generator().manual_seed(seed)
    experts, k = model.config.n_routed_experts, model.config.num_experts_per_tok
    with torch.no_grad():
        for n, t in list(model.named_parameters()) + list(model.named_buffers()):
            if n.endswith(("sinks", "position_bias", ".base", "hc_base", "e_score_correction_bias")):
                t.copy_(torch.randn(t.shape, generator=g) * 0.5)
            elif n.endswith((".scale", "hc_scale")):
                t.copy_(1 + torch.randn(t.shape, generator=g) * 0.3)
            elif n.endswith("tid2eid"):
                t.copy_(torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(t.shape[0])]))


def build(tiny_dir, tmp_path, name="v4", **kw):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.DeepseekV4Config(**{**BASE, **kw}))
    randomize(model)
    out = tmp_path / name
    model.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny_dir("qwen3_moe") / f, out / f)
    return out


VARIANTS = {
    "base": {},
    # every layer compressed, three hyper-connection streams, yarn on the compress rope
    "all_compressed_yarn": dict(layer_types=TYPES[1:] + ["heavily_compressed_attention"], hc_mult=3,
                                o_groups=4, rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                             "original_max_position_embeddings": 32}),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_logits_match_transformers(tiny_dir, tmp_path, name):
    d = build(tiny_dir, tmp_path, name, **VARIANTS[name])
    ids = ids_for(45)
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), reference_logits(d, ids))


def test_indexer_selection_and_hash_table_are_live(tiny_dir, tmp_path):
    """Attending every compressed entry, or routing hash layers by the learned gate, moves the
    logits far from the reference: both paths are exercised by the match above."""
    d = build(tiny_dir, tmp_path)
    ids = ids_for(45)
    ref = reference_logits(d, ids)
    llm = LLM(str(d), dtype="float32")
    for layer in llm.engine.model.layers:
        if layer.attn.indexer is not None:
            layer.attn.indexer.topk = 10 ** 6
    assert (llm.score(ids) - ref).abs().max() > 1e-2 * ref.abs().max()
    llm = LLM(str(d), dtype="float32")
    layer0 = llm.engine.model.layers[0].mlp
    layer0.tid2eid = layer0.tid2eid.roll(1, dims=0)
    assert (llm.score(ids) - ref).abs().max() > 1e-2 * ref.abs().max()


def test_incremental_decode_equals_full_forward(tiny_dir, tmp_path):
    check_incremental_equals_full(build(tiny_dir, tmp_path), prompt_len=11, steps=16)


def test_batch_equals_single(tiny_dir, tmp_path):
    check_batch_equals_single(build(tiny_dir, tmp_path))


def test_snapshot_restore_equals_recompute(tiny_dir, tmp_path):
    """Snapshot at 12: mid-window for HCA (rate 8), window state full, CSA overlap set."""
    check_snapshot_restore_equals_recompute(build(tiny_dir, tmp_path))


def test_state_position_guard(tiny_dir, tmp_path):
    check_state_position_guard(build(tiny_dir, tmp_path))


def test_no_paged_kv_and_state_bytes(tiny_dir, tmp_path):
    """Windows and compressed entries are per-sequence state; their bytes grow with the entries."""
    llm = LLM(str(build(tiny_dir, tmp_path)), dtype="float32")
    model = llm.engine.model
    assert llm.engine.runner.kv == {} and model.kv_layers() == []
    st = model.make_state()
    empty = st.nbytes
    assert st.parts["window"].k.shape == (4, 8, 1, 32)
    st.parts["compress1"].count = 3
    assert st.nbytes == empty + 3 * 32 * 4


def test_make_tiny_deepseek_v4(tiny_dir):
    d = tiny_dir("deepseek_v4", layers=4)
    ids = ids_for(40)
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), reference_logits(d, ids))


def dequantized_copy(d, out):
    """transformers' own dequantizer (Fp8Dequantize: FP8 + UE8M0 blocks, FP4 + UE8M0 per 32)
    applied to the quantized checkpoint; its FP8 loader needs accelerate, absent here."""
    import json

    from safetensors.torch import load_file, save_file
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    shutil.copytree(d, out)
    t = load_file(str(out / "model.safetensors"))
    deq = Fp8Dequantize(None)
    save_file({n: (deq._dequantize_one(w, t[n + "_scale_inv"], torch.float32) if n + "_scale_inv" in t else w)
               for n, w in t.items() if not n.endswith("_scale_inv")}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    del cfg["quantization_config"]
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_fp8_dense_fp4_experts_as_shipped(tiny_dir, tmp_path):
    """V4-Flash's format: FP8 projections with UE8M0 scales stay packed (wo_a split per group
    at 128-row blocks), FP4 experts become the MXFP4 banks without a copy through float."""
    from freetoken.models.deepseek.deepseek_v4 import quantize_checkpoint

    d = build(tiny_dir, tmp_path, "q", hidden_size=128, q_lora_rank=128, head_dim=64, o_lora_rank=128,
              moe_intermediate_size=64, index_head_dim=32)
    quantize_checkpoint(d)
    ref_dir = dequantized_copy(d, tmp_path / "deq")
    ids = ids_for(40)
    ref = reference_logits(ref_dir, ids)
    exact = LLM(str(d), dtype="float32", moe_backend="resident")
    model = exact.engine.model
    assert model.pool.spec.fmt == "mxfp4"
    attn = model.layers[1].attn
    assert attn.wq_b.weight.dtype == torch.float8_e4m3fn and attn.wo_a[1].weight.dtype == torch.float8_e4m3fn
    with exact_experts():        # dequantize-then-matmul experts, activations not rounded: exact
        assert_logits_close(exact.score(ids), ref)
    # as served, resident rounds the activations as the kernels do (int8 per 32): one answer with cpu
    assert_logits_close(exact.score(ids), ref, rel=2e-2)
    # the CPU kernels quantize activations to int8 per 32 for MXFP4 (llama.cpp's Q8_0 scheme)
    assert_logits_close(LLM(str(d), dtype="float32", moe_backend="cpu").score(ids), ref, rel=2e-2)


def test_prefix_cache_exact(tiny_dir, tmp_path):
    check_prefix_cache_exact(build(tiny_dir, tmp_path))
