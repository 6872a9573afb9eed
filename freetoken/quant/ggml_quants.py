"""llama.cpp's (ggml's) block quantizations: sizes, torch dequantization bit-exact to
`gguf.quants.dequantize`, and a simple round-to-nearest quantizer producing valid blocks.

A quantized row of `cols` elements is `cols / block_elems(t)` blocks of `block_bytes(t)` bytes.
Block layouts (little-endian; d, dmin: fp16; k-quants have 256-element super-blocks):
  Q4_0   [d | qs 16]                 x = d * (nibble - 8); low nibbles: 0..15, high: 16..31
  Q4_1   [d | m | qs 16]             x = d * nibble + m
  Q5_0   [d | qh u32 | qs 16]        x = d * ((nibble | bit_i << 4) - 16), bit i of qh for element i
  Q5_1   [d | m | qh u32 | qs 16]    x = d * (nibble | bit_i << 4) + m
  IQ4_NL [d | qs 16]                 x = d * kvalues[nibble] (IQ4_XS's non-linear 16 values)
  Q8_0   [d | qs int8 32]            x = d * q
  MXFP4  [e8m0 | qs 16]              x = 2^(e-128) * (2 * e2m1); nibbles as Q4_0
  Q4_K   [d | dmin | scales 12 | qs 128]      x = d*sc_j * q - dmin*m_j, 6-bit sc/m per 32
  Q5_K   [d | dmin | scales 12 | qh 32 | qs 128]  as Q4_K with a fifth bit from qh
  Q6_K   [ql 128 | qh 64 | scales int8 16 | d]   x = d*sc_g * (q - 32), one scale per 16
  IQ4_XS [d | scales_h u16 | scales_l 4 | qs 128]  x = d*(sc_j - 32) * kvalues[nibble]
  Q2_K   [scales 16 | qs 64 | d | dmin]          x = d*(sc_g & 15) * q - dmin*(sc_g >> 4), per 16
  Q3_K   [hmask 32 | qs 64 | scales 12 | d]      x = d*(sc_g - 32) * (q | hbit << 2 - 4), 6-bit sc per 16
  TQ2_0  [qs 64 | d]                             x = d * (q - 1), q 2 bits (ternary)
  TQ1_0  [qs 48 | qh 4 | d]                      x = d * (trit - 1), 5 (qh: 4) trits per byte in base 3
The 2-bit fields of Q2_K/Q3_K/TQ2_0: element 128 h + 32 j + i is bits 2j..2j+1 of qs[32 h + i].
  F32 / F16 / BF16: plain values.
"""
from __future__ import annotations

import torch

from .consts import const

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, BF16, TQ1_0, TQ2_0, MXFP4 = 10, 11, 12, 13, 14, 20, 23, 30, 34, 35, 39
# one entry per type: name, (elements, bytes) per block
NAMES = {F32: "F32", F16: "F16", Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0", Q5_1: "Q5_1", Q8_0: "Q8_0",
         Q2_K: "Q2_K", Q3_K: "Q3_K", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K", IQ4_NL: "IQ4_NL",
         IQ4_XS: "IQ4_XS", BF16: "BF16", TQ1_0: "TQ1_0", TQ2_0: "TQ2_0", MXFP4: "MXFP4"}
_SIZES = {F32: (1, 4), F16: (1, 2), BF16: (1, 2), Q4_0: (32, 18), Q4_1: (32, 20), Q5_0: (32, 22),
          Q5_1: (32, 24), Q8_0: (32, 34), IQ4_NL: (32, 18), MXFP4: (32, 17), Q2_K: (256, 84),
          Q3_K: (256, 110), Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210), IQ4_XS: (256, 136),
          TQ1_0: (256, 54), TQ2_0: (256, 66)}
FLOAT_TYPES = (F32, F16, BF16)
# the types the C kernels (kernels/c/ggml.c decode GEMV + tiles, ggml_dense.c rows) read packed
KERNEL_TYPES = (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, TQ1_0, TQ2_0)
_E2M1_X2 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
_IQ4_NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)

# the lattice i-quants (IQ1_S .. IQ3_S) live in their own module: here only their ids and sizes
from . import ggml_iquants as _iq  # noqa: E402
IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M = (_iq.IQ2_XXS, _iq.IQ2_XS, _iq.IQ2_S, _iq.IQ3_XXS,
                                                      _iq.IQ3_S, _iq.IQ1_S, _iq.IQ1_M)
NAMES.update(_iq.NAMES)
_SIZES.update(_iq.SIZES)
KERNEL_TYPES += _iq.TYPES             # the lattice i-quants (kernels/c/ggml_iq.c)


def _check(t: int) -> int:
    t = int(t)
    if t not in _SIZES:
        raise ValueError(f"ggml type {t} is not supported; expected one of "
                         + ", ".join(f"{NAMES[k]}={k}" for k in sorted(_SIZES)))
    return t


def type_name(t: int) -> str:
    return NAMES[_check(t)]


def block_elems(t: int) -> int:
    return _SIZES[_check(t)][0]


def block_bytes(t: int) -> int:
    return _SIZES[_check(t)][1]


def row_bytes(t: int, cols: int) -> int:
    """Bytes of one row of `cols` elements in type `t` (cols must be a multiple of the block)."""
    be, bb = _SIZES[_check(t)]
    if cols % be:
        raise ValueError(f"{NAMES[t]} rows need a multiple of {be} elements, got {cols}")
    return cols // be * bb


# ------------------------------------------------------------------ dequantization

def _f16(b: torch.Tensor) -> torch.Tensor:
    """[..., 2k] bytes -> [..., k] float32 of the little-endian fp16 values."""
    return b.contiguous().view(torch.float16).float()


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 packed bytes [..., 12] -> 6-bit (sc, m) [..., 8] as float32."""
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], -1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], -1)
    return sc.float(), mn.float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[..., k] bytes -> [..., 2k]: the k low nibbles, then the k high nibbles."""
    return torch.cat([qs & 0x0F, qs >> 4], -1)


def _qh_bits(qh: torch.Tensor) -> torch.Tensor:
    """Q5_0/Q5_1's 4 bytes [nb, 4] -> [nb, 32] uint8: bit i (little-endian u32) for element i."""
    shifts = torch.arange(8, dtype=torch.uint8, device=qh.device)
    return ((qh.unsqueeze(-1) >> shifts) & 1).reshape(qh.shape[0], 32)


def _crumbs(qs: torch.Tensor) -> torch.Tensor:
    """2-bit fields [nb, 32 h] -> [nb, 128 h] uint8: element 128 h + 32 j + i = bits 2j of qs[32 h + i]."""
    shifts = const((0, 2, 4, 6), torch.uint8, qs.device).reshape(1, 1, 4, 1)
    return ((qs.reshape(qs.shape[0], -1, 1, 32) >> shifts) & 3).reshape(qs.shape[0], -1)


def _trits(b: torch.Tensor) -> torch.Tensor:
    """TQ1_0's 52 packed bytes [nb, 52] -> [nb, 256] uint8 trits 0..2: byte * 3^p keeps trit p in
    its top, read as (u8 * 3) >> 8."""
    nb, dev = b.shape[0], b.device
    pw = lambda k: const((1, 3, 9, 27, 81)[:k], torch.uint8, dev).reshape(1, k, 1)  # noqa: E731
    q0 = (b[:, :32].reshape(nb, 1, 32) * pw(5)).reshape(nb, 160)
    q1 = (b[:, 32:48].reshape(nb, 1, 16) * pw(5)).reshape(nb, 80)
    qh = (b[:, 48:52].reshape(nb, 1, 4) * pw(4)).reshape(nb, 16)
    return ((torch.cat([q0, q1, qh], -1).to(torch.int32) * 3) >> 8).to(torch.uint8)


def _q3_scales(s: torch.Tensor) -> torch.Tensor:
    """Q3_K's 12 bytes [nb, 12] -> [nb, 16] float32 signed scales (6 bits - 32)."""
    lo = torch.cat([s[:, :8] & 0x0F, s[:, :8] >> 4], -1)
    sh = const((0, 2, 4, 6), torch.uint8, s.device).reshape(1, 4, 1)
    hi = ((s[:, 8:12].reshape(-1, 1, 4) >> sh) & 3).reshape(-1, 16)
    return ((lo | (hi << 4)).to(torch.int8) - 32).float()


def _deq_blocks(b: torch.Tensor, t: int) -> torch.Tensor:
    """b: [nb, block_bytes] uint8 -> [nb, block_elems] float32 (numpy-gguf's operation order)."""
    nb = b.shape[0]
    if t == Q4_1:
        return _f16(b[:, :2]) * _nibbles(b[:, 4:]).float() + _f16(b[:, 2:4])
    if t == Q5_0:
        q = _nibbles(b[:, 6:]) | (_qh_bits(b[:, 2:6]) << 4)
        return _f16(b[:, :2]) * (q.to(torch.int8) - 16).float()
    if t == Q5_1:
        q = _nibbles(b[:, 8:]) | (_qh_bits(b[:, 4:8]) << 4)
        return _f16(b[:, :2]) * q.float() + _f16(b[:, 2:4])
    if t == IQ4_NL:
        lut = const(_IQ4_NL, torch.float32, b.device)
        return _f16(b[:, :2]) * lut[_nibbles(b[:, 2:]).long()]
    if t == Q2_K:
        sc, d, dmin = b[:, :16], _f16(b[:, 80:82]), _f16(b[:, 82:84])
        dl = (d * (sc & 0x0F).float()).reshape(nb, 16, 1)
        ml = (dmin * (sc >> 4).float()).reshape(nb, 16, 1)
        return (dl * _crumbs(b[:, 16:80]).reshape(nb, 16, 16).float() - ml).reshape(nb, 256)
    if t == Q3_K:
        dl = (_f16(b[:, 108:110]) * _q3_scales(b[:, 96:108])).reshape(nb, 16, 1)
        hb = (b[:, :32].reshape(nb, 1, 32) >> torch.arange(8, dtype=torch.uint8, device=b.device).reshape(1, 8, 1)) & 1
        q = _crumbs(b[:, 32:96]).to(torch.int8) - ((hb.reshape(nb, 256) ^ 1) << 2).to(torch.int8)
        return (dl * q.reshape(nb, 16, 16).float()).reshape(nb, 256)
    if t == TQ2_0:
        return _f16(b[:, 64:66]) * (_crumbs(b[:, :64]).to(torch.int8) - 1).float()
    if t == TQ1_0:
        return _f16(b[:, 52:54]) * (_trits(b).to(torch.int8) - 1).float()
    if t in _iq.NAMES:
        return _iq.dequantize_blocks(b, t)
    if t == Q8_0:
        return b[:, 2:].contiguous().view(torch.int8).float() * _f16(b[:, :2])
    if t == Q4_0:
        return _f16(b[:, :2]) * (_nibbles(b[:, 2:]).to(torch.int8) - 8).float()
    if t == MXFP4:
        e = b[:, :1].to(torch.int32)
        bits = torch.where(e < 2, torch.bitwise_left_shift(torch.full_like(e, 0x00200000), e), (e - 1) << 23)
        d = bits.view(torch.float32)
        lut = const(_E2M1_X2, torch.float32, b.device)
        return d * lut[_nibbles(b[:, 1:]).long()]
    if t in (Q4_K, Q5_K):
        d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
        sc, m = _k_scales(b[:, 4:16])
        d = (d * sc).reshape(nb, 8, 1)
        dm = (dmin * m).reshape(nb, 8, 1)
        qs = b[:, 48:] if t == Q5_K else b[:, 16:]
        q = torch.stack([qs.reshape(nb, 4, 32) & 0x0F, qs.reshape(nb, 4, 32) >> 4], 2).reshape(nb, 8, 32)
        if t == Q5_K:
            shifts = torch.arange(8, dtype=torch.uint8, device=b.device).reshape(1, 8, 1)
            q = q | (((b[:, 16:48].reshape(nb, 1, 32) >> shifts) & 1) << 4)
        return (d * q.float() - dm).reshape(nb, 256)
    if t == Q6_K:
        ql, qh, sc, d = b[:, :128], b[:, 128:192], b[:, 192:208], _f16(b[:, 208:210])
        d = (d * sc.contiguous().view(torch.int8).float()).reshape(nb, 16, 1)
        ql = ql.reshape(nb, 2, 1, 64) >> const((0, 4), torch.uint8, b.device).reshape(1, 1, 2, 1)
        ql = (ql & 0x0F).reshape(nb, 8, 32)
        qh = qh.reshape(nb, 2, 1, 32) >> const((0, 2, 4, 6), torch.uint8, b.device).reshape(1, 1, 4, 1)
        qh = (qh & 0x03).reshape(nb, 8, 32)
        q = ((ql | (qh << 4)).to(torch.int8) - 32).reshape(nb, 16, 16).float()
        return (d * q).reshape(nb, 256)
    if t == IQ4_XS:
        d = _f16(b[:, 0:2])
        sh = b[:, 2:4].contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
        sl = torch.stack([b[:, 4:8] & 0x0F, b[:, 4:8] >> 4], -1).reshape(nb, 8).to(torch.int32)
        sh = (sh >> torch.arange(0, 16, 2, device=b.device)) & 3
        dl = (d * ((sl | (sh << 4)) - 32).float()).reshape(nb, 8, 1)
        q = torch.stack([b[:, 8:].reshape(nb, 8, 16) & 0x0F, b[:, 8:].reshape(nb, 8, 16) >> 4], 2)
        lut = const(_IQ4_NL, torch.float32, b.device)
        return (dl * lut[q.reshape(nb, 8, 32).long()]).reshape(nb, 256)
    raise AssertionError(t)


def dequantize(raw: torch.Tensor, t: int, cols: int) -> torch.Tensor:
    """raw uint8 [..., >= row_bytes(t, cols)] (rows may be zero-padded past their blocks) ->
    float32 [..., cols], bit-exact to `gguf.quants.dequantize`."""
    t = _check(t)
    if raw.dtype != torch.uint8:
        raise ValueError(f"ggml rows must be uint8 bytes, got {raw.dtype}")
    rb = row_bytes(t, cols)
    if raw.shape[-1] < rb:
        raise ValueError(f"{NAMES[t]} rows of {cols} elements need {rb} bytes, got {raw.shape[-1]}")
    lead = raw.shape[:-1]
    b = raw[..., :rb].contiguous()
    if t == F32:
        return b.view(torch.float32).reshape(*lead, cols).clone()
    if t in (F16, BF16):
        return b.view(torch.float16 if t == F16 else torch.bfloat16).float().reshape(*lead, cols)
    out = _deq_blocks(b.reshape(-1, block_bytes(t)), t)
    return out.reshape(*lead, cols)


# ------------------------------------------------------------------ quantization (round to nearest)

def _as_f16_bytes(v: torch.Tensor) -> torch.Tensor:
    return v.to(torch.float16).contiguous().view(torch.uint8)


def _round(v: torch.Tensor) -> torch.Tensor:
    """Round half away from zero (ggml's roundf)."""
    return torch.sign(v) * torch.floor(v.abs() + 0.5)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """[nb, 32] codes 0..15 -> [nb, 16] bytes (elements 0..15 low nibbles, 16..31 high)."""
    return (q[:, :16] & 0x0F) | (q[:, 16:] << 4)


def _pack_qh(q: torch.Tensor) -> torch.Tensor:
    """[nb, 32] 5-bit codes -> [nb, 4] bytes: bit i of the little-endian u32 = bit 4 of code i."""
    hb = (q >> 4).reshape(-1, 4, 8).to(torch.int32) << torch.arange(8, dtype=torch.int32)
    return hb.sum(-1).to(torch.uint8)


def _pack_crumbs(q: torch.Tensor) -> torch.Tensor:
    """[nb, 128 h] 2-bit codes -> [nb, 32 h] bytes (inverse of _crumbs)."""
    q = q.reshape(q.shape[0], -1, 4, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(q.shape[0], -1)


def _minmax_codes(x: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_1/Q5_1 (gguf's quantizer): d = (max - min) / top, codes trunc((x - min) / d + 0.5)."""
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    d = (hi - lo) / top
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = torch.trunc((x - lo) * inv + 0.5).clamp(0, top).to(torch.uint8)
    return d, lo, q


_QUANT_32 = (Q4_1, Q5_1, Q5_0, IQ4_NL, Q8_0, Q4_0, MXFP4)
_QUANT_LOW_BITS = (Q2_K, Q3_K, TQ1_0, TQ2_0)


def _quant_blocks(x: torch.Tensor, t: int) -> torch.Tensor:
    """x: [nb, block_elems] float32 -> [nb, block_bytes] uint8."""
    if t in _QUANT_32:
        return _quant_32(x, t)
    if t in _QUANT_LOW_BITS:
        return _quant_low_bits(x, t)
    return _quant_k(x, t)


def _quant_32(x: torch.Tensor, t: int) -> torch.Tensor:
    """Blocks of 32 (legacy types, IQ4_NL, MXFP4)."""
    nb = x.shape[0]
    if t == Q4_1:
        d, lo, q = _minmax_codes(x, 15)
        return torch.cat([_as_f16_bytes(d), _as_f16_bytes(lo), _pack_nibbles(q)], -1)
    if t == Q5_1:
        d, lo, q = _minmax_codes(x, 31)
        return torch.cat([_as_f16_bytes(d), _as_f16_bytes(lo), _pack_qh(q), _pack_nibbles(q)], -1)
    if t == Q5_0:   # gguf's: d = max / -16 with the signed value of largest magnitude
        mx = x.gather(-1, x.abs().argmax(-1, keepdim=True))
        d = mx / -16
        inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
        q = torch.trunc(x * inv + 16.5).clamp(0, 31).to(torch.uint8)
        return torch.cat([_as_f16_bytes(d), _pack_qh(q), _pack_nibbles(q)], -1)
    if t == IQ4_NL:  # kvalues[0] = -127 reaches the largest magnitude; nearest value per element
        mx = x.gather(-1, x.abs().argmax(-1, keepdim=True))
        d16 = (mx / -127).to(torch.float16).float()
        lut = torch.tensor(_IQ4_NL, dtype=torch.float32)
        q = (d16.unsqueeze(-1) * lut - x.unsqueeze(-1)).abs().argmin(-1).to(torch.uint8)
        return torch.cat([_as_f16_bytes(d16), _pack_nibbles(q)], -1)
    if t == Q8_0:
        d = x.abs().amax(-1, keepdim=True) / 127
        inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
        return torch.cat([_as_f16_bytes(d), _round(x * inv).to(torch.int8).view(torch.uint8)], -1)
    if t == Q4_0:   # ggml's: d = max / -8 with the signed value of largest magnitude
        mx = x.gather(-1, x.abs().argmax(-1, keepdim=True))
        d = mx / -8
        inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
        q = torch.trunc(x * inv + 8.5).clamp(0, 15).to(torch.uint8)
        return torch.cat([_as_f16_bytes(d), q[:, :16] | (q[:, 16:] << 4)], -1)
    if t == MXFP4:
        amax = x.abs().amax(-1, keepdim=True)
        e = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(1e-38))) - 2 + 127,
                        torch.zeros_like(amax)).clamp(0, 255).to(torch.uint8)
        d = _deq_blocks(torch.cat([e, torch.full((nb, 16), 0x11, dtype=torch.uint8)], -1), MXFP4)[:, :1]
        lut = torch.tensor(_E2M1_X2, dtype=torch.float32)
        q = (d.unsqueeze(-1) * lut - x.unsqueeze(-1)).abs().argmin(-1).to(torch.uint8)
        return torch.cat([e, q[:, :16] | (q[:, 16:] << 4)], -1)
    raise AssertionError(t)


def _quant_low_bits(x: torch.Tensor, t: int) -> torch.Tensor:
    """The 2- and 3-bit k-quants and the ternary types (256 per block)."""
    nb = x.shape[0]
    if t == Q2_K:
        xs = x.reshape(nb, 16, 16)
        lo = xs.amin(-1).clamp(max=0)
        scale = (xs.amax(-1) - lo) / 3
        d16 = (scale.amax(-1, keepdim=True) / 15).to(torch.float16).float()
        dm16 = ((-lo).amax(-1, keepdim=True) / 15).to(torch.float16).float()
        sc = torch.where(d16 > 0, _round(scale / d16.clamp_min(1e-30)), 0).clamp(0, 15).to(torch.uint8)
        m = torch.where(dm16 > 0, _round(-lo / dm16.clamp_min(1e-30)), 0).clamp(0, 15).to(torch.uint8)
        step, off = (d16 * sc.float()).unsqueeze(-1), (dm16 * m.float()).unsqueeze(-1)
        q = torch.where(step > 0, _round((xs + off) / step.clamp_min(1e-30)), 0).clamp(0, 3).to(torch.uint8)
        return torch.cat([sc | (m << 4), _pack_crumbs(q.reshape(nb, 256)), _as_f16_bytes(d16), _as_f16_bytes(dm16)], -1)
    if t == Q3_K:
        xs = x.reshape(nb, 16, 16)
        mx = xs.gather(-1, xs.abs().argmax(-1, keepdim=True)).squeeze(-1)
        scale = mx / -4
        d16 = (scale.abs().amax(-1, keepdim=True) / 31).to(torch.float16).float()
        sc = torch.where(d16 > 0, _round(scale / d16.clamp_min(1e-30)), 0).clamp(-32, 31)
        step = (d16 * sc).unsqueeze(-1)
        q = torch.where(step != 0, _round(xs / torch.where(step == 0, 1, step)), 0).clamp(-4, 3)
        u = (q + 4).to(torch.uint8).reshape(nb, 256)
        hb = (u >> 2).reshape(nb, 8, 32).to(torch.int32) << torch.arange(8, dtype=torch.int32).reshape(1, 8, 1)
        s6 = (sc + 32).to(torch.uint8)
        sh = s6 >> 4
        scales = torch.cat([(s6[:, :8] & 0x0F) | ((s6[:, 8:] & 0x0F) << 4),
                            sh[:, 0:4] | (sh[:, 4:8] << 2) | (sh[:, 8:12] << 4) | (sh[:, 12:16] << 6)], -1)
        return torch.cat([hb.sum(1).to(torch.uint8), _pack_crumbs(u & 3), scales, _as_f16_bytes(d16)], -1)
    if t in (TQ1_0, TQ2_0):   # gguf's: d = amax, trits roundf(x / d) + 1
        d = x.abs().amax(-1, keepdim=True)
        inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
        q = (_round(x * inv) + 1).to(torch.uint8)
        if t == TQ2_0:
            return torch.cat([_pack_crumbs(q), _as_f16_bytes(d)], -1)
        p5 = torch.tensor([81, 27, 9, 3, 1], dtype=torch.int32).reshape(1, 5, 1)
        q0 = (q[:, :160].reshape(nb, 5, 32).to(torch.int32) * p5).sum(1)
        q1 = (q[:, 160:240].reshape(nb, 5, 16).to(torch.int32) * p5).sum(1)
        qh = (q[:, 240:].reshape(nb, 4, 4).to(torch.int32) * p5[:, :4]).sum(1)
        qs = (torch.cat([q0, q1, qh], -1) * 256 + 242) // 243     # trit p in the top of byte * 3^p
        return torch.cat([qs.to(torch.uint8), _as_f16_bytes(d)], -1)
    raise AssertionError(t)


def _quant_k(x: torch.Tensor, t: int) -> torch.Tensor:
    """Q4_K, Q5_K, Q6_K and IQ4_XS (256 per block, 6-bit or 8-bit sub-block scales)."""
    nb = x.shape[0]
    if t in (Q4_K, Q5_K):
        top = 15 if t == Q4_K else 31
        xs = x.reshape(nb, 8, 32)
        lo = xs.amin(-1).clamp(max=0)
        scale = (xs.amax(-1) - lo) / top
        d = scale.amax(-1, keepdim=True) / 63
        dmin = (-lo).amax(-1, keepdim=True) / 63
        d16, dm16 = d.to(torch.float16).float(), dmin.to(torch.float16).float()
        sc = torch.where(d16 > 0, _round(scale / d16.clamp_min(1e-30)), 0).clamp(0, 63).to(torch.uint8)
        m = torch.where(dm16 > 0, _round(-lo / dm16.clamp_min(1e-30)), 0).clamp(0, 63).to(torch.uint8)
        step, off = (d16 * sc.float()).unsqueeze(-1), (dm16 * m.float()).unsqueeze(-1)
        q = torch.where(step > 0, _round((xs + off) / step.clamp_min(1e-30)), 0).clamp(0, top).to(torch.uint8)
        packed = torch.cat([(sc[:, :4]) | ((sc[:, 4:] >> 4) << 6), (m[:, :4]) | ((m[:, 4:] >> 4) << 6),
                            (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)], -1)
        ql = (q & 0x0F).reshape(nb, 4, 2, 32)
        qs = (ql[:, :, 0] | (ql[:, :, 1] << 4)).reshape(nb, 128)
        parts = [_as_f16_bytes(d), _as_f16_bytes(dmin), packed]
        if t == Q5_K:
            hb = (q >> 4).reshape(nb, 8, 32)
            qh = torch.zeros(nb, 32, dtype=torch.uint8)
            for j in range(8):
                qh |= hb[:, j] << j
            parts.append(qh)
        return torch.cat(parts + [qs], -1)
    if t == Q6_K:
        xs = x.reshape(nb, 16, 16)
        mx = xs.gather(-1, xs.abs().argmax(-1, keepdim=True)).squeeze(-1)
        scale = mx / -32
        d = scale.abs().amax(-1, keepdim=True) / 127
        d16 = d.to(torch.float16).float()
        sc = torch.where(d16 > 0, _round(scale / d16.clamp_min(1e-30)), 0).clamp(-127, 127)
        step = (d16 * sc).unsqueeze(-1)
        q = (torch.where(step != 0, _round(xs / torch.where(step == 0, 1, step)), 0).clamp(-32, 31) + 32)
        q = q.to(torch.uint8).reshape(nb, 2, 4, 32)
        lo = q & 0x0F
        ql = torch.cat([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], -1)
        qh = ((q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6))
        return torch.cat([ql.reshape(nb, 128), qh.reshape(nb, 64),
                          sc.to(torch.int8).view(torch.uint8), _as_f16_bytes(d)], -1)
    if t == IQ4_XS:
        xs = x.reshape(nb, 8, 32)
        lut = torch.tensor(_IQ4_NL, dtype=torch.float32)
        mx = xs.gather(-1, xs.abs().argmax(-1, keepdim=True)).squeeze(-1)
        scale = mx / (-127)     # kvalues[0] = -127 reaches the largest magnitude
        d = scale.abs().amax(-1, keepdim=True) / 31
        d16 = d.to(torch.float16).float()
        ls = torch.where(d16 > 0, _round(scale / d16.clamp_min(1e-30)), 0).clamp(-32, 31)
        step = (d16 * ls).unsqueeze(-1)
        q = (step.unsqueeze(-1) * lut - xs.unsqueeze(-1)).abs().argmin(-1).to(torch.uint8)
        u = (ls + 32).to(torch.int32)
        sh = torch.zeros(nb, dtype=torch.int32)
        for j in range(8):
            sh |= (u[:, j] >> 4) << (2 * j)
        sl = ((u[:, 0::2] & 15) | ((u[:, 1::2] & 15) << 4)).to(torch.uint8)
        qs = (q[:, :, :16] | (q[:, :, 16:] << 4)).reshape(nb, 128)
        return torch.cat([_as_f16_bytes(d), sh.to(torch.int16).contiguous().view(torch.uint8).reshape(nb, 2), sl, qs], -1)
    raise AssertionError(t)


def quantize(x: torch.Tensor, t: int) -> torch.Tensor:
    """float [..., cols] -> uint8 [..., row_bytes(t, cols)] of valid `t` blocks (round to nearest)."""
    t = _check(t)
    if t in _iq.NAMES:
        raise NotImplementedError(f"no quantizer for {NAMES[t]} here (llama.cpp's llama-quantize writes them); "
                                  "ggml_iquants.random_rows makes valid blocks")
    cols = x.shape[-1]
    lead = x.shape[:-1]
    rb = row_bytes(t, cols)
    x = x.detach().float().cpu()
    if t == F32:
        return x.contiguous().view(torch.uint8).reshape(*lead, rb)
    if t in (F16, BF16):
        return x.to(torch.float16 if t == F16 else torch.bfloat16).contiguous().view(torch.uint8).reshape(*lead, rb)
    return _quant_blocks(x.reshape(-1, block_elems(t)), t).reshape(*lead, rb)


# byte offsets of fp16 scales in each block: their exponent byte is masked to keep them finite
_F16_AT = {Q8_0: (0,), Q4_0: (0,), Q4_1: (0, 2), Q5_0: (0,), Q5_1: (0, 2), IQ4_NL: (0,), Q2_K: (80, 82),
           Q3_K: (108,), Q4_K: (0, 2), Q5_K: (0, 2), Q6_K: (208,), IQ4_XS: (0,), TQ1_0: (52,), TQ2_0: (64,)}


def f16_scale_offsets(t: int) -> tuple[int, ...]:
    """Byte offsets of the fp16 scales (d, and m / dmin where the type has one) in a block of `t`."""
    return _F16_AT.get(_check(t), ())


def random_rows(t: int, rows: int, cols: int, gen: torch.Generator | None = None) -> torch.Tensor:
    """Random valid rows: random bytes with every fp16 scale kept finite (tests, benchmarks)."""
    if t in _iq.NAMES:
        return _iq.random_rows(t, rows, cols, gen)
    raw = torch.randint(0, 256, (rows, row_bytes(t, cols)), dtype=torch.uint8, generator=gen)
    if t in _F16_AT:
        blk = raw.view(rows, -1, block_bytes(t))
        for off in _F16_AT[t]:
            blk[..., off + 1] &= 0x3B          # |value| < 2^15, never inf/nan
    elif t != MXFP4:                        # plain floats: keep them finite and moderate
        w = {F16: 2, BF16: 2, F32: 4}[t]
        raw.view(rows, -1, w)[..., w - 1] &= 0x3B if t == F16 else 0x3F
    return raw
