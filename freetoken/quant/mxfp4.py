"""MXFP4 (OCP microscaling FP4, as gpt-oss and DeepSeek-V4 store experts): e2m1 values, two per
byte (low nibble = even element), one e8m0 power-of-two scale (bias 127) per 32 elements
along the input dimension. Blocks [..., G, 16] uint8, scales [..., G] uint8."""
from __future__ import annotations

import torch

FP4_VALUES = (+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """blocks uint8 [..., G, 16], scales uint8 [..., G] -> [..., G*32] in `dtype`.

    Same arithmetic as transformers' `convert_moe_packed_tensors` (lut lookup in `dtype`, then
    ldexp), so results are bit-identical to it, minus its final transpose."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise ValueError(f"mxfp4 blocks {tuple(blocks.shape)} do not match scales {tuple(scales.shape)}")
    lut = torch.tensor(FP4_VALUES, dtype=dtype, device=blocks.device)
    b = blocks.to(torch.uint8)
    out = torch.empty(*b.shape[:-1], 32, dtype=dtype, device=b.device)
    out[..., 0::2] = lut[(b & 0x0F).long()]
    out[..., 1::2] = lut[(b >> 4).long()]
    torch.ldexp(out, (scales.to(torch.int32) - 127).unsqueeze(-1), out=out)
    return out.reshape(*b.shape[:-2], b.shape[-2] * 32)


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float [..., n] (n % 32 == 0) -> (blocks uint8 [..., n/32, 16], scales uint8 [..., n/32]).
    Scale = 2^(floor(log2(amax)) - 2), values rounded to the nearest e2m1. Runs over chunks of
    rows: the rounding needs ~50 bytes of temporaries per weight (a 0.5 G-weight bank at once
    would take 25 GB)."""
    n = w.shape[-1]
    if n % 32:
        raise ValueError("mxfp4 needs the input dimension to be a multiple of 32")
    flat = w.reshape(-1, n)
    step = max(1, _CHUNK_WEIGHTS // n)
    parts = [_quantize_rows(flat[i:i + step]) for i in range(0, flat.shape[0], step)]
    blocks = torch.cat([b for b, _ in parts]) if parts else torch.empty(0, n // 32, 16, dtype=torch.uint8)
    scales = torch.cat([s for _, s in parts]) if parts else torch.empty(0, n // 32, dtype=torch.uint8)
    return blocks.reshape(*w.shape[:-1], n // 32, 16), scales.reshape(*w.shape[:-1], n // 32)


_CHUNK_WEIGHTS = 1 << 22


def _quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = w.float().reshape(*w.shape[:-1], -1, 32)
    amax = x.abs().amax(-1)
    e = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(1e-30))) - 2, torch.full_like(amax, -127))
    e = e.clamp(-127, 127)
    y = x / torch.ldexp(torch.ones_like(e), e.int()).unsqueeze(-1)
    mags = torch.tensor(FP4_VALUES[:8], dtype=torch.float32, device=w.device)
    idx = (y.abs().unsqueeze(-1) - mags).abs().argmin(-1)
    code = (idx | ((y < 0).long() << 3)).to(torch.uint8)
    blocks = code[..., 0::2] | (code[..., 1::2] << 4)
    return blocks.contiguous(), (e + 127).to(torch.uint8)
