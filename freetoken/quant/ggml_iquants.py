"""llama.cpp's lattice i-quants: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M.
Sizes, torch dequantization bit-exact to `gguf.quants.dequantize`, and random valid rows.

Each 256-weight super-block has one fp16 scale d and per 32 (or 16) weights a small integer
scale; weights come in groups of 8 (IQ2/IQ1) or 4 (IQ3) whose magnitudes are one point of a
fixed grid (the tables are data: taken from the `gguf` package, whose grids are llama.cpp's;
kernels/gen_iq_grids.py writes the same tables as the C header kernels/c/ggml_iq_grids.h).
Block layouts (little-endian):
  IQ2_XXS [d | 8 x (u8 idx[4], u32 aux)]            66  grid 256x8 {8,25,43}; aux: 4 x 7-bit
          sign index (ksigns: 8th sign = parity), scale = aux >> 28;  x = d(0.5+s)/4 * g * sign
  IQ2_XS  [d | u16 qs[32] | scales 8]               74  grid 512x8; qs: 9-bit idx, 7-bit sign idx;
          a 4-bit scale per 16 weights
  IQ2_S   [d | idx 32 | signs 32 | qh 8 | scales 8] 82  grid 1024x8; idx | 2 bits of qh << 8;
          one sign bit per weight; a 4-bit scale per 16
  IQ3_XXS [d | idx 64 | u32 aux[8]]                 98  grid 256x4 {4..62}; aux as IQ2_XXS's,
          x = d(0.5+s)/2 * g * sign
  IQ3_S   [d | idx 64 | qh 8 | signs 32 | scales 4] 110 grid 512x4 {1..15}; x = d(1+2s) * g * sign
  IQ1_S   [d | idx 32 | u16 qh[8]]                  50  grid 2048x8 {-1,0,1}; qh: 4 x 3 high idx
          bits, 3-bit scale s, delta sign;  x = d(2s+1) * (g +- 1/8)
  IQ1_M   [idx 32 | qh 16 | u16 sc[4]]              56  as IQ1_S, idx high bits and delta sign per
          8 weights, a 3-bit scale per 16; d = the top nibbles of sc[0..3] as one fp16
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from .consts import array_const, const

IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ3_S, IQ2_S, IQ1_M = 16, 17, 18, 19, 21, 22, 29
NAMES = {IQ2_XXS: "IQ2_XXS", IQ2_XS: "IQ2_XS", IQ3_XXS: "IQ3_XXS", IQ1_S: "IQ1_S",
         IQ3_S: "IQ3_S", IQ2_S: "IQ2_S", IQ1_M: "IQ1_M"}
SIZES = {IQ2_XXS: (256, 66), IQ2_XS: (256, 74), IQ3_XXS: (256, 98), IQ1_S: (256, 50),
         IQ3_S: (256, 110), IQ2_S: (256, 82), IQ1_M: (256, 56)}
TYPES = tuple(NAMES)
# the gguf.quants class holding each type's grid (IQ1_M shares IQ1_S's)
_GRID_OF = {IQ2_XXS: "IQ2_XXS", IQ2_XS: "IQ2_XS", IQ2_S: "IQ2_S", IQ3_XXS: "IQ3_XXS",
            IQ3_S: "IQ3_S", IQ1_S: "IQ1_S", IQ1_M: "IQ1_S"}


@functools.cache
def grid_np(t: int) -> np.ndarray:
    """The grid of type t as float32 [points, 8 or 4]: gguf.quants' (llama.cpp's) values."""
    import gguf
    cls = getattr(gguf.quants, _GRID_OF[t])
    cls.init_grid()
    return np.ascontiguousarray(np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape))


@functools.cache
def ksigns_np() -> np.ndarray:
    """128 sign bytes of IQ2_XXS/IQ2_XS/IQ3_XXS: 7 sign bits + the parity bit (bit 7)."""
    import gguf
    return np.frombuffer(gguf.quants.IQ2_XXS.ksigns, dtype=np.uint8).copy()


def _grid(t: int, device) -> torch.Tensor:
    return array_const(f"grid{t}", lambda: grid_np(t), device)


def _f16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float()


def _u16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF


def _u32(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _bits(v: torch.Tensor, n: int) -> torch.Tensor:
    """[..., k] integers -> [..., k, n] their low n bits as +1 (0) / -1 (1) float signs."""
    sh = torch.arange(n, device=v.device)
    return torch.where((v.unsqueeze(-1).to(torch.int64) >> sh) & 1 == 0, 1.0, -1.0)


def _ksigns(idx: torch.Tensor) -> torch.Tensor:
    """7-bit sign indices [...] -> [..., 8] signs (+-1.0)."""
    ks = array_const("ksigns", ksigns_np, idx.device)
    return _bits(ks[idx.long()], 8)


def _nib16(s: torch.Tensor) -> torch.Tensor:
    """[nb, k] scale bytes -> [nb, 2k] nibbles (low, high of each byte) as float32."""
    return torch.stack([s & 0x0F, s >> 4], -1).reshape(s.shape[0], -1).float()


def dequantize_blocks(b: torch.Tensor, t: int) -> torch.Tensor:
    """b: [nb, block_bytes] uint8 -> [nb, 256] float32, in numpy-gguf's operation order."""
    nb, dev = b.shape[0], b.device
    g = _grid(t, dev)
    if t in (IQ2_XXS, IQ3_XXS):
        d = _f16(b[:, :2])
        if t == IQ2_XXS:
            aux = _u32(b[:, 2:]).reshape(nb, 8, 2)
            idx, aux = b[:, 2:].reshape(nb, 8, 8)[:, :, :4], aux[..., 1]
            db = d * (0.5 + (aux >> 28).float()) * 0.25
        else:
            idx, aux = b[:, 2:66].reshape(nb, 8, 8), _u32(b[:, 66:98])
            db = d * (0.5 + (aux >> 28).float()) * 0.5
        sg = _ksigns((aux.unsqueeze(-1) >> const((0, 7, 14, 21), torch.int64, dev)) & 0x7F)
        gv = g[idx.long()].reshape(nb, 8, 32)
        return (db.reshape(nb, 8, 1) * gv * sg.reshape(nb, 8, 32)).reshape(nb, 256)
    if t == IQ2_XS:
        d, qs = _f16(b[:, :2]), _u16(b[:, 2:66]).reshape(nb, 32)
        db = (d * (0.5 + _nib16(b[:, 66:74])) * 0.25).reshape(nb, 16, 1)
        sg = _ksigns(qs >> 9).reshape(nb, 16, 16)
        gv = g[(qs & 511).long()].reshape(nb, 16, 16)
        return (db * gv * sg).reshape(nb, 256)
    if t == IQ2_S:
        d = _f16(b[:, :2])
        qh = b[:, 66:74].to(torch.int32).unsqueeze(-1) >> const((0, 2, 4, 6), torch.int64, dev)
        idx = b[:, 2:34].to(torch.int32) | ((qh & 3).reshape(nb, 32) << 8)
        db = (d * (0.5 + _nib16(b[:, 74:82])) * 0.25).reshape(nb, 16, 1)
        sg = _bits(b[:, 34:66], 8).reshape(nb, 16, 16)
        return (db * g[idx.long()].reshape(nb, 16, 16) * sg).reshape(nb, 256)
    if t == IQ3_S:
        d = _f16(b[:, :2])
        qh = _bits(b[:, 66:74], 8).reshape(nb, 64) < 0           # the 9th index bit
        idx = b[:, 2:66].to(torch.int32) | (qh.to(torch.int32) << 8)
        db = (d * (1 + 2 * _nib16(b[:, 106:110]))).reshape(nb, 8, 1)
        sg = _bits(b[:, 74:106], 8).reshape(nb, 8, 32)
        return (db * g[idx.long()].reshape(nb, 8, 32) * sg).reshape(nb, 256)
    if t == IQ1_S:
        d, qh = _f16(b[:, :2]), _u16(b[:, 34:50])
        dl = (d * (2 * ((qh >> 12) & 7) + 1).float()).reshape(nb, 8, 1, 1)
        delta = torch.where(qh & 0x8000 == 0, 0.125, -0.125).reshape(nb, 8, 1, 1)
        hi = (qh.unsqueeze(-1) >> const((0, 3, 6, 9), torch.int64, dev)) & 7
        idx = b[:, 2:34].to(torch.int32) | (hi.reshape(nb, 32) << 8)
        return (dl * (g[idx.long()].reshape(nb, 8, 4, 8) + delta)).reshape(nb, 256)
    if t == IQ1_M:
        sc = _u16(b[:, 48:56])
        d16 = ((sc >> 12) & 0xF) << const((0, 4, 8, 12), torch.int64, dev)
        d = (d16.sum(-1)).to(torch.int16).view(torch.float16).float().reshape(nb, 1)
        s3 = ((sc.unsqueeze(-1) >> const((0, 3, 6, 9), torch.int64, dev)) & 7).reshape(nb, 16)
        dl = (d * (2 * s3 + 1).float()).reshape(nb, 8, 2, 1, 1)
        qh = (b[:, 32:48].to(torch.int32).unsqueeze(-1) >> const((0, 4), torch.int64, dev)).reshape(nb, 32)
        idx = b[:, :32].to(torch.int32) | ((qh & 7) << 8)
        delta = torch.where(qh & 8 == 0, 0.125, -0.125).reshape(nb, 8, 2, 2, 1)
        return (dl * (g[idx.long()].reshape(nb, 8, 2, 2, 8) + delta)).reshape(nb, 256)
    raise AssertionError(t)


# high byte of every fp16 scale in a block: masked to keep |d| < 2^15 (never inf/nan)
_F16_HI = {IQ2_XXS: (1,), IQ2_XS: (1,), IQ2_S: (1,), IQ3_XXS: (1,), IQ3_S: (1,), IQ1_S: (1,)}


def random_rows(t: int, rows: int, cols: int, gen: torch.Generator | None = None,
                scale: float | None = None) -> torch.Tensor:
    """Random valid rows [rows, cols / 256 * block_bytes]: every index, sign and scale bit pattern
    is a valid i-quant block, only the fp16 d must stay finite. `scale`: d set to that fp16
    value instead of a random one (weights of a usable magnitude, for model tests)."""
    be, bb = SIZES[t]
    if cols % be:
        raise ValueError(f"{NAMES[t]} rows need a multiple of {be} elements, got {cols}")
    raw = torch.randint(0, 256, (rows, cols // be * bb), dtype=torch.uint8, generator=gen)
    blk = raw.view(rows, -1, bb)
    if t == IQ1_M:   # d's bits are the top nibbles of the four u16 scales (bytes 49, 51, 53, 55)
        if scale is not None:
            h = int(torch.tensor([scale], dtype=torch.float16).view(torch.int16).item()) & 0xFFFF
            for k in range(4):
                blk[..., 49 + 2 * k] = (blk[..., 49 + 2 * k] & 0x0F) | (((h >> (4 * k)) & 0xF) << 4)
        else:        # fp16 high byte = nibble 3 << 4 | nibble 2: mask it with 0x3B as elsewhere
            blk[..., 53] &= 0xBF
            blk[..., 55] &= 0x3F
        return raw
    if scale is not None:
        blk[..., 0:2] = torch.tensor([scale], dtype=torch.float16).view(torch.uint8)
    else:
        blk[..., 1] &= 0x3B
    return raw
