"""NVFP4 (NVIDIA's 4-bit float, as the official GLM-5.x and Qwen3.6 low-bit builds store experts):
e2m1 values, two per byte (low nibble = even element, as MXFP4), one FP8 e4m3 scale per 16
elements along the input dimension, and one float32 scale per tensor.

In our banks: blocks uint8 [..., out, in/16, 8], scales uint8 [..., out, in/16] (the e4m3 bits),
global scale float32 [..., out] (one value per row, so that gate and up, which checkpoints scale
separately, can share one fused [2I, H] matrix). Dequantized value = (e2m1 * e4m3) * global:
e2m1 x e4m3 is exact in float32 (2 + 4 significant bits), so the only rounding is the last
product, and the C kernels reproduce it bit for bit.

Checkpoints (NVIDIA ModelOpt, `quant_algo: NVFP4`): `weight` uint8 [out, in/2], `weight_scale`
float8_e4m3fn [out, in/16], `weight_scale_2` float32 scalar (the dequantization multiplier),
`input_scale` (activation quantization for FP4 tensor cores; unused here)."""
from __future__ import annotations

import torch

from .mxfp4 import FP4_VALUES

GROUP = 16
E2M1_MAX, E4M3_MAX = 6.0, 448.0


def dequantize_nvfp4(blocks: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """blocks uint8 [..., G, 8], scales uint8 (e4m3 bits) or float8_e4m3fn [..., G], global_scale
    float32 broadcastable to [...] -> [..., G*16] in `dtype` (computed in float32)."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != GROUP // 2:
        raise ValueError(f"nvfp4 blocks {tuple(blocks.shape)} do not match scales {tuple(scales.shape)}")
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)
    b = blocks.to(torch.uint8)
    v = torch.empty(*b.shape[:-1], GROUP, dtype=torch.float32, device=b.device)
    v[..., 0::2] = lut[(b & 0x0F).long()]
    v[..., 1::2] = lut[(b >> 4).long()]
    s = scales.view(torch.float8_e4m3fn) if scales.dtype == torch.uint8 else scales
    v = v * s.float().unsqueeze(-1)                                      # exact
    g = global_scale.float().reshape(*global_scale.shape, *([1] * (b.dim() - global_scale.dim())))
    return (v * g).reshape(*b.shape[:-2], b.shape[-2] * GROUP).to(dtype)


def quantize_nvfp4(w: torch.Tensor, global_scale: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float [..., out, n] (n % 16 == 0) -> (blocks, scales, global scale [..., out]).
    As ModelOpt: global = amax / (6 * 448) over the whole matrix (`w`'s last two dims) unless
    given, block scale = e4m3(block_amax / 6 / global), values rounded to the nearest e2m1."""
    n = w.shape[-1]
    if n % GROUP:
        raise ValueError(f"nvfp4 needs the input dimension to be a multiple of {GROUP}, got {n}")
    x = w.float()
    if global_scale is None:
        amax = x.abs().amax(dim=(-2, -1), keepdim=True)
        global_scale = torch.where(amax > 0, amax / (E2M1_MAX * E4M3_MAX), torch.ones_like(amax))
        global_scale = global_scale.expand(*x.shape[:-1], 1).squeeze(-1)
    g = global_scale.float().expand(x.shape[:-1]).unsqueeze(-1).unsqueeze(-1)      # [..., out, 1, 1]
    xb = x.reshape(*x.shape[:-1], n // GROUP, GROUP)
    s = (xb.abs().amax(-1, keepdim=True) / E2M1_MAX / g).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    step = s.float() * g
    y = torch.where(step > 0, xb / step, torch.zeros_like(xb))
    mags = torch.tensor(FP4_VALUES[:8], dtype=torch.float32, device=w.device)
    idx = (y.abs().unsqueeze(-1) - mags).abs().argmin(-1)
    code = (idx | ((y < 0).long() << 3)).to(torch.uint8)
    blocks = code[..., 0::2] | (code[..., 1::2] << 4)
    return (blocks.contiguous(), s.squeeze(-1).view(torch.uint8).contiguous(),
            global_scale.float().expand(x.shape[:-1]).contiguous())


def from_checkpoint(weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ModelOpt tensors of one linear [out, in] -> (blocks [out, in/16, 8], scales [out, in/16], global [out])."""
    out, half = weight.shape
    if weight.dtype != torch.uint8 or weight_scale.shape != (out, half * 2 // GROUP):
        raise ValueError(f"nvfp4 weight {tuple(weight.shape)} {weight.dtype} and weight_scale "
                         f"{tuple(weight_scale.shape)} are not the ModelOpt layout ([out, in/2] uint8, [out, in/16])")
    if weight_scale_2.numel() != 1:
        raise ValueError(f"nvfp4 weight_scale_2 has {weight_scale_2.numel()} elements, expected one")
    return (weight.reshape(out, half * 2 // GROUP, GROUP // 2), weight_scale.view(torch.uint8),
            weight_scale_2.float().reshape(1).expand(out).contiguous())


# --- expert banks: each scale row carries its row's global scale -------------------------------
# The kernels take one scale pointer per weight row, so an expert bank's scale row is the row's
# e4m3 bytes followed by its float32 global scale (4 little-endian bytes): [..., out, in/16 + 4].

def pack_scales(scales: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """scales uint8 [..., G], global float32 [...] -> uint8 [..., G + 4]."""
    g = global_scale.float().expand(scales.shape[:-1]).contiguous().unsqueeze(-1).view(torch.uint8)
    return torch.cat([scales.view(torch.uint8), g], dim=-1).contiguous()


def unpack_scales(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 [..., G + 4] -> (scales uint8 [..., G], global float32 [...])."""
    return packed[..., :-4], packed[..., -4:].contiguous().view(torch.float32).squeeze(-1)


def quantize_bank(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float [N, out, in] -> (blocks [N, out, in/16, 8], packed scales [N, out, in/16 + 4]),
    one global scale per expert matrix (as ModelOpt writes them)."""
    blocks, scales, glob = quantize_nvfp4(w)
    return blocks, pack_scales(scales, glob)


def dequantize_bank(blocks: torch.Tensor, packed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    scales, glob = unpack_scales(packed)
    return dequantize_nvfp4(blocks, scales, glob, dtype)
