"""FP8 e4m3 weights with one float32 scale per 128x128 block (DeepSeek-V3/R1, Qwen3-FP8 style):
weight [.., rows, cols] float8_e4m3fn, weight_scale_inv [.., ceil(rows/128), ceil(cols/128)].
Dequantized value = float(w) * scale_inv of its block."""
from __future__ import annotations

import torch

BLOCK = 128
E4M3_MAX = 448.0


def block_scales(s: torch.Tensor) -> torch.Tensor:
    """Block scales as float32: fp32/bf16 as stored, UE8M0 (float8_e8m0fnu, or its raw uint8
    exponent byte, value 2^(b - 127)) exactly."""
    if s.dtype == torch.uint8:
        return torch.ldexp(torch.ones(s.shape), s.to(torch.int32) - 127)
    return s.float()


def dequantize_fp8_block(w: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype = torch.float32,
                         block: int = BLOCK) -> torch.Tensor:
    """Bit-identical to transformers' `_dequantize_fp8_weight(w, s, [128, 128], dtype)`:
    both multiply in `dtype` once per element."""
    rows, cols = w.shape[-2:]
    s = scale_inv.to(dtype).repeat_interleave(block, dim=-2)[..., :rows, :]
    s = s.repeat_interleave(block, dim=-1)[..., :cols]
    return w.to(dtype) * s


def quantize_fp8_block(w: torch.Tensor, block: int = BLOCK, pow2: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """float [.., rows, cols] -> (float8_e4m3fn weights, float32 scale_inv per block), scale = amax/448
    (`pow2`: rounded up to a power of two, the UE8M0 scales of DeepSeek-V3.1/V4)."""
    rows, cols = w.shape[-2:]
    br, bc = -(-rows // block), -(-cols // block)
    pad = torch.zeros(*w.shape[:-2], br * block, bc * block, dtype=torch.float32, device=w.device)
    pad[..., :rows, :cols] = w.float()
    tiles = pad.unflatten(-2, (br, block)).unflatten(-1, (bc, block))   # [.., br, B, bc, B]
    amax = tiles.abs().amax(dim=(-3, -1))                                # [.., br, bc]
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    if pow2:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    full = scale.repeat_interleave(block, -2).repeat_interleave(block, -1)[..., :rows, :cols]
    q = (w.float() / full).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.contiguous(), scale.contiguous()


def quantize_checkpoint_fp8(model_dir, keep=("embed_tokens", "lm_head", "norm", "mlp.gate.", "indexer.weights_proj")) -> None:
    """Rewrite a float checkpoint as DeepSeek ships FP8: every 2-D `*.weight` whose name contains
    none of `keep` becomes float8_e4m3fn plus a `*.weight_scale_inv` per 128x128 block, and
    config.json gets the matching `quantization_config` (make-tiny and the tests use it;
    transformers reads it back by dequantizing on the CPU)."""
    import json
    from pathlib import Path

    from safetensors.torch import load_file, save_file

    d = Path(model_dir)
    index = d / "model.safetensors.index.json"
    wm = json.loads(index.read_text())["weight_map"] if index.is_file() else None
    for f in sorted(d.glob("*.safetensors")):
        out = {}
        for name, t in load_file(str(f)).items():
            if name.endswith(".weight") and t.dim() == 2 and not any(k in name for k in keep):
                out[name], out[name + "_scale_inv"] = quantize_fp8_block(t)
                if wm is not None:
                    wm[name + "_scale_inv"] = f.name
            else:
                out[name] = t
        save_file(out, str(f), metadata={"format": "pt"})
    if wm is not None:
        index.write_text(json.dumps({"metadata": {}, "weight_map": wm}, indent=2))
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128]}
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
