"""gpt-oss against transformers: sinks, alternating sliding/full attention, YaRN, biased
router and experts with clamped SwiGLU, MXFP4 experts kept packed."""
from __future__ import annotations

import pytest
import torch
import transformers
from safetensors import safe_open

from helpers import assert_logits_close, exact_experts, reference_logits
from model_checks import (
    check_batch_equals_single,
    check_prefix_cache_exact,
    check_incremental_equals_full,
    check_snapshot_restore_equals_recompute,
    check_state_position_guard,
    ids_for,
)
from freetoken import LLM
from freetoken.quant.mxfp4 import dequantize_mxfp4


def test_logits_match_transformers_beyond_the_window(tiny_dir):
    d = tiny_dir("gpt_oss", layers=4)                 # window 8, prompt 40
    ids = ids_for(40)
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), reference_logits(d, ids))


def test_incremental_decode_equals_full_forward(tiny_dir):
    check_incremental_equals_full(tiny_dir("gpt_oss"), prompt_len=5, steps=12)


def test_batch_equals_single(tiny_dir):
    check_batch_equals_single(tiny_dir("gpt_oss"))


def test_snapshot_restore_equals_recompute(tiny_dir):
    check_snapshot_restore_equals_recompute(tiny_dir("gpt_oss"))


def test_state_position_guard(tiny_dir):
    check_state_position_guard(tiny_dir("gpt_oss"))


def test_window_layers_hold_only_the_window(tiny_dir):
    llm = LLM(str(tiny_dir("gpt_oss", layers=4)), dtype="float32")
    model = llm.engine.model
    assert sorted(llm.engine.runner.kv) == [1, 3]     # sliding layers 0 and 2 keep no paged KV
    st = model.make_state()
    w = st.parts["window"]
    assert w.k.shape == (2, 8, model.kv_heads, model.head_dim)
    assert st.nbytes == 2 * 2 * 8 * model.kv_heads * model.head_dim * 4


def _mxfp4_reference(d):
    """transformers' own CPU path for MXFP4: dequantize with convert_moe_packed_tensors at load."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    config = transformers.AutoConfig.from_pretrained(d)
    del config.quantization_config
    model = transformers.GptOssForCausalLM(config).eval()
    sd = {}
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        for name in f.keys():
            if name.endswith("_blocks"):
                base = name[: -len("_blocks")]
                sd[base] = convert_moe_packed_tensors(f.get_tensor(name), f.get_tensor(base + "_scales"),
                                                      dtype=torch.float32)
            elif not name.endswith("_scales"):
                sd[name] = f.get_tensor(name)
    model.load_state_dict(sd, strict=True)
    return model


def test_mxfp4_logits_match_transformers(tiny_dir):
    d = tiny_dir("gpt_oss_mxfp4", layers=2)
    ids = ids_for(30)
    with torch.no_grad():
        ref = _mxfp4_reference(d)(torch.tensor([ids])).logits[0]
    resident = LLM(str(d), dtype="float32", moe_backend="resident")
    with exact_experts():        # dequantize-then-matmul experts, activations not rounded: exact
        assert_logits_close(resident.score(ids), ref)
    # as served, resident rounds the activations as the kernels do (int8 per 32): one answer with cpu
    assert_logits_close(resident.score(ids), ref, rel=2e-2)
    # the CPU kernels quantize activations to int8 per 32 (llama.cpp's Q8_0 scheme) for MXFP4
    assert_logits_close(LLM(str(d), dtype="float32", moe_backend="cpu").score(ids), ref, rel=2e-2)


def test_mxfp4_stays_packed_and_dequantizes_bit_exactly(tiny_dir):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    d = tiny_dir("gpt_oss_mxfp4", layers=2)
    pool = LLM(str(d), dtype="bfloat16").engine.model.pool
    assert pool.spec.fmt == "mxfp4"
    for name in ("gate_up_blocks", "gate_up_scales", "down_blocks", "down_scales"):
        assert pool.banks[name].dtype == torch.uint8
    weights = pool.num_layers * pool.num_experts * 3 * pool.spec.hidden * pool.spec.intermediate
    packed = sum(pool.banks[n].nbytes for n in ("gate_up_blocks", "gate_up_scales", "down_blocks", "down_scales"))
    assert packed * 8 / weights == pytest.approx(4.25)
    e, inter = pool.num_experts, pool.spec.intermediate
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        for layer in range(pool.num_layers):
            p = f"model.layers.{layer}.mlp.experts"
            for proj, bank in (("gate_up_proj", "gate_up"), ("down_proj", "down")):
                for dtype in (torch.bfloat16, torch.float32):
                    ref = convert_moe_packed_tensors(f.get_tensor(f"{p}.{proj}_blocks"),
                                                     f.get_tensor(f"{p}.{proj}_scales"), dtype=dtype)
                    ref = ref.transpose(1, 2)                           # [E, out, in], gate/up interleaved
                    if proj == "gate_up_proj":
                        ref = torch.cat([ref[:, 0::2], ref[:, 1::2]], dim=1)
                    rows = slice(layer * e, (layer + 1) * e)
                    ours = dequantize_mxfp4(pool.banks[f"{bank}_blocks"][rows], pool.banks[f"{bank}_scales"][rows],
                                            dtype=dtype)
                    assert torch.equal(ours, ref)
    assert inter % 32 == 0


def test_prefix_cache_serves_the_same_logits(tiny_dir):
    check_prefix_cache_exact(tiny_dir("gpt_oss"))


@pytest.mark.parametrize("mode", ["amx", "vdpbf16ps", "torch"])
def test_bf16_prefill_attention_modes_in_chunks_close_to_transformers(tiny_dir, monkeypatch, mode):
    """bf16 gpt-oss with each prefill attention mode forced, a 40-token prompt in chunks of 16 (full
    layers: chunks after cached keys; window-8 layers: after the ring's keys), against transformers
    in float32 within bf16's tolerance; where a kernel mode runs, its sinks and windows did run. The
    bf16 dots stay off (their activations rounded to bf16 move this random model's logits ~0.3 on
    their own, and their choice is timing-calibrated)."""
    from freetoken.kernels import load
    from freetoken.layers.attention import prefill
    lib = load("native")
    code = {"torch": 0, "amx": 1, "vdpbf16ps": 2}[mode]
    if lib is None or lib.ft_set_prefill_att(code) != code:
        pytest.skip(f"{mode} does not run here")
    lib.ft_set_prefill_att(0)
    ran, tiles = [], prefill.tiles_chunk
    monkeypatch.setattr(prefill, "tiles_chunk", lambda *a, **kw: ran.append(r := tiles(*a, **kw)) or r)
    d = tiny_dir("gpt_oss", layers=4, hidden=128)          # head dim 32: the kernel's
    ids = ids_for(40)
    llm = LLM(str(d), dtype="bfloat16", prefill_attention=mode, prefill_gemm="bfloat16", bf16_dot="off",
              max_num_batched_tokens=16)
    ours, ref = llm.score(ids), reference_logits(d, ids)
    assert (ours - ref).abs().max() < 0.02 * max(1.0, ref.abs().max().item())
    assert any(r is not None for r in ran) == (mode != "torch")
