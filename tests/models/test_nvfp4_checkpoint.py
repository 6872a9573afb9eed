"""ModelOpt NVFP4 checkpoints: routed experts stay packed in "nvfp4" banks (CPU kernels, or the
torch reference executor), other quantized linears are dequantized at load. The reference is
transformers on the same checkpoint with every NVFP4 tensor dequantized back to float by
quant/nvfp4.py (bit-exact with transformers' own NVFP4 dequantizer, tests/weights)."""
from __future__ import annotations

import json
import shutil

import torch
from safetensors.torch import load_file, save_file

from freetoken import LLM
from freetoken.weights.checkpoint import Checkpoint
from freetoken.weights.modelopt import dequantize, quantize_checkpoint

from helpers import assert_logits_close, exact_experts, reference_logits
from model_checks import check_incremental_equals_full, ids_for


def dequantized_copy(src, dst):
    """The NVFP4 checkpoint with its quantized linears written back as float32 weights."""
    shutil.copytree(src, dst)
    ck = Checkpoint(src)
    f = dst / "model.safetensors"
    out = {}
    for name, t in load_file(str(f)).items():
        if name.endswith(("_scale", "_scale_2", "input_scale")):
            continue
        if t.dtype == torch.uint8:
            t = dequantize(ck, name, (t.shape[0], t.shape[1] * 2), torch.float32)
        out[name] = t
    save_file(out, str(f), metadata={"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text())
    del cfg["quantization_config"]
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst


def test_make_tiny_nvfp4_experts_match_transformers(tiny_dir, tmp_path):
    d = tiny_dir("glm4_moe_nvfp4", layers=3)
    ref_dir = dequantized_copy(d, tmp_path / "float")
    ids = ids_for(33)
    ref = reference_logits(ref_dir, ids)
    resident = LLM(str(d), dtype="float32", moe_backend="resident")
    assert resident.engine.model.pool.spec.fmt == "nvfp4"
    assert resident.engine.model.pool.banks["gate_up_blocks"].dtype == torch.uint8
    with exact_experts():        # dequantize-then-matmul experts, activations not rounded: exact
        assert_logits_close(resident.score(ids), ref)
    # as served, resident rounds the activations as the kernels do (int8 per 32): one answer with cpu
    assert_logits_close(resident.score(ids), ref, rel=2e-2)
    cpu = LLM(str(d), dtype="float32", moe_backend="cpu").score(ids)     # int8 activations in the kernels
    assert (cpu - ref).abs().max() < 0.02 * ref.abs().max()


def test_every_linear_nvfp4(tiny_dir, tmp_path):
    """Attention, dense and shared-expert linears quantized too (dequantized at load)."""
    d = tmp_path / "all"
    shutil.copytree(tiny_dir("glm4_moe", layers=3), d)
    quantize_checkpoint(d, lambda n: n.startswith("model.layers.") and not n.endswith("mlp.gate.weight"))
    ids = ids_for(29, seed=2)
    ref = reference_logits(dequantized_copy(d, tmp_path / "float"), ids)
    with exact_experts():        # the experts' activations not rounded as the kernels round them
        assert_logits_close(LLM(str(d), dtype="float32", moe_backend="resident").score(ids), ref)


def test_nvfp4_decode_equals_full_forward(tiny_dir):
    check_incremental_equals_full(tiny_dir("glm4_moe_nvfp4", layers=3))
