"""8-bit integer weights, FreeToken's equivalent of llama.cpp's Q8_0: int8 values [.., rows, n]
plus one float16 scale per 32 consecutive inputs [.., rows, n/32] (1.0625 bytes per weight, the
same as Q8_0). value = q * scale; quantization as llama.cpp: scale = amax/127, q = round(w/scale)."""
from __future__ import annotations

import torch

GROUP = 32


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float [.., n] (n % 32 == 0) -> (int8 [.., n], float16 scales [.., n/32])."""
    if w.shape[-1] % GROUP:
        raise ValueError("int8 needs the input dimension to be a multiple of 32")
    x = w.float().unflatten(-1, (-1, GROUP))
    d = x.abs().amax(-1) / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(x * inv.unsqueeze(-1)).clamp(-127, 127).to(torch.int8)
    return q.flatten(-2).contiguous(), d.to(torch.float16).contiguous()


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    x = q.to(dtype).unflatten(-1, (-1, GROUP)) * scales.to(dtype).unsqueeze(-1)
    return x.flatten(-2)
