"""llama.cpp's (ggml's) block quantizations: sizes, torch dequantization bit-exact to
`gguf.quants.dequantize`, and a simple round-to-nearest quantizer producing valid blocks.

A quantized row of `cols` elements is `cols / block_elems(t)` blocks of `block_bytes(t)` bytes.
Block layouts (little-endian; d, dmin: fp16; k-quants have 256-element super-blocks):
  Q4_0   [d | qs 16]                 x = d * (nibble - 8); low nibbles: 0..15, high: 16..31
  Q8_0   [d | qs int8 32]            x = d * q
  MXFP4  [e8m0 | qs 16]              x = 2^(e-128) * (2 * e2m1); nibbles as Q4_0
  Q4_K   [d | dmin | scales 12 | qs 128]      x = d*sc_j * q - dmin*m_j, 6-bit sc/m per 32
  Q5_K   [d | dmin | scales 12 | qh 32 | qs 128]  as Q4_K with a fifth bit from qh
  Q6_K   [ql 128 | qh 64 | scales int8 16 | d]   x = d*sc_g * (q - 32), one scale per 16
  IQ4_XS [d | scales_h u16 | scales_l 4 | qs 128]  x = d*(sc_j - 32) * kvalues[nibble]
  F32 / F16 / BF16: plain values.
"""
from __future__ import annotations

import torch

F32, F16, Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS, BF16, MXFP4 = 0, 1, 2, 8, 12, 13, 14, 23, 30, 39
NAMES = {F32: "F32", F16: "F16", Q4_0: "Q4_0", Q8_0: "Q8_0", Q4_K: "Q4_K", Q5_K: "Q5_K",
         Q6_K: "Q6_K", IQ4_XS: "IQ4_XS", BF16: "BF16", MXFP4: "MXFP4"}
_SIZES = {F32: (1, 4), F16: (1, 2), BF16: (1, 2), Q4_0: (32, 18), Q8_0: (32, 34), MXFP4: (32, 17),
          Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210), IQ4_XS: (256, 136)}
FLOAT_TYPES = (F32, F16, BF16)
_E2M1_X2 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
_IQ4_NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)

# the lattice i-quants (IQ1_S .. IQ3_S) live in their own module: here only their ids and sizes
from . import ggml_iquants as _iq  # noqa: E402
IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M = (_iq.IQ2_XXS, _iq.IQ2_XS, _iq.IQ2_S, _iq.IQ3_XXS,
                                                      _iq.IQ3_S, _iq.IQ1_S, _iq.IQ1_M)
NAMES.update(_iq.NAMES)
_SIZES.update(_iq.SIZES)


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


def _deq_blocks(b: torch.Tensor, t: int) -> torch.Tensor:
    """b: [nb, block_bytes] uint8 -> [nb, block_elems] float32 (numpy-gguf's operation order)."""
    nb = b.shape[0]
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
        lut = torch.tensor(_E2M1_X2, dtype=torch.float32, device=b.device)
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
        ql = ql.reshape(nb, 2, 1, 64) >> torch.tensor([0, 4], dtype=torch.uint8, device=b.device).reshape(1, 1, 2, 1)
        ql = (ql & 0x0F).reshape(nb, 8, 32)
        qh = qh.reshape(nb, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device).reshape(1, 1, 4, 1)
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
        lut = torch.tensor(_IQ4_NL, dtype=torch.float32, device=b.device)
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


def _quant_blocks(x: torch.Tensor, t: int) -> torch.Tensor:
    """x: [nb, block_elems] float32 -> [nb, block_bytes] uint8."""
    nb = x.shape[0]
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
_F16_AT = {Q8_0: (0,), Q4_0: (0,), Q4_K: (0, 2), Q5_K: (0, 2), Q6_K: (208,), IQ4_XS: (0,)}


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
