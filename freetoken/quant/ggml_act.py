"""The ggml layers' activation rounding on the prefill path, to match the C GEMV's
(kernels/c/ggml_act.c): under llama.cpp's numerics ("llama") a prefill GEMM multiplies the
dequantized weights by activations rounded exactly as ggml-cpu's quantize_row_q8_0/q8_1 round
them (int8 per 32, the scale in fp16), and a Q4_1 / Q5_1 layer adds its block mins times q8_1's
fp16 block sums where the float product carries the exact ones. The products are then
llama.cpp's integer dots up to the order of fp32 sums. Under "q8" (the default) the prefill
keeps the activations exact and the GEMV rounds them to int8 per 32 with fp32 scales; under
"float32" decode too goes through the dequantize + fp32 GEMM path (exact, slower)."""
from __future__ import annotations

import torch

from . import ggml_quants as gq

ACT_MODES = {"q8": 0, "llama": 1, "float32": 2}    # kernels/c/ggml_act.c's switch


def act_mode(numerics: str) -> int:
    """The C switch for a ggml_numerics choice ("llama-exact": its layers without an exact sum
    keep llama.cpp's rounding; "auto" and "q8k": q8, the k-quant rows' per-256 decode activations
    being a switch of their own, kernels/ggml_k256.py)."""
    return ACT_MODES.get("llama" if numerics == "llama-exact" else numerics, ACT_MODES["q8"])
_MIN_TYPES = {gq.Q4_1: 20, gq.Q5_1: 24}      # block bytes; the fp16 min m at byte 2


def q8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x rounded as q8_0/q8_1: q * fp16(d), [M, K] fp32; per block of 32 the q8_1 sum's
    rounding fp16(d sum q) - fp16(d) sum q, [M, K / 32])."""
    b = x.float().unflatten(-1, (-1, 32))
    amax = b.abs().amax(-1, keepdim=True)
    d = amax / 127
    q = torch.round(b * torch.where(amax > 0, torch.full_like(amax, 127) / amax, torch.zeros_like(amax)))   # x86 ggml-cpu: 127 / amax, not 1 / d
    d16 = d.half().float()
    sq = q.sum(-1)
    return (q * d16).flatten(-2), (d[..., 0] * sq).half().float() - d16[..., 0] * sq


def block_mins(rows: torch.Tensor, type_: int, cols: int) -> torch.Tensor | None:
    """[N, cols / 32] fp32 block mins of Q4_1 / Q5_1 rows (None for other types)."""
    bs = _MIN_TYPES.get(type_)
    if bs is None:
        return None
    nb = cols // 32
    blocks = rows[:, :nb * bs].reshape(rows.shape[0], nb, bs)
    return blocks[..., 2:4].contiguous().view(torch.float16)[..., 0].float()


def sum_rounding(s_corr: torch.Tensor, parts, r0: int, r1: int) -> torch.Tensor | None:
    """What q8_1's fp16 block sums add to output columns [r0, r1) of a layer of `parts`
    (GgmlWeight list, rows stacked): s_corr @ mins^T over the Q4_1 / Q5_1 parts, else None."""
    out, base = None, 0
    for p in parts:
        n = p.rows.shape[0]
        a, b = max(r0, base), min(r1, base + n)
        if a < b and p.type in _MIN_TYPES:
            m = block_mins(p.rows[a - base:b - base], p.type, p.cols)
            if out is None:
                out = torch.zeros(s_corr.shape[0], r1 - r0)
            out[:, a - r0:b - r0] += s_corr @ m.T
        base += n
    return out
