"""The reference expert executor: dequantize, then torch matmuls grouped per expert. It is the
`resident` backend's compute, the CPU executor's prefill path (experts with many tokens) and
its no-compiler fallback, and the reference every faster executor is tested against."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .formats import activate, dequantize_expert
from .pool import ExpertSpec


def run_experts(banks: dict[str, torch.Tensor], spec: ExpertSpec, flat_ids: torch.Tensor,
                x: torch.Tensor, weights: torch.Tensor, out: torch.Tensor | None = None, *,
                dtype: torch.dtype | None = None, tokens_min: int = 0, dequant=None) -> torch.Tensor:
    """out[t] += sum_k weights[t,k] * expert_{flat_ids[t,k]}(x[t]); ids < 0 are skipped.

    Computes in `dtype` (default x's) and accumulates in float32 (float64 when dtype is);
    returns the accumulator. Only experts with at least `tokens_min` routed tokens are computed
    (the CPU executor's prefill split); `dequant(fid)` replaces `dequantize_expert` (the CPU
    executor's C dequantization).

    A 3-D `out` [T, K, H] takes each choice's weighted output at out[t, k] instead of the sum
    (written, not added): the caller sums over k in a fixed order, so the result does not
    depend on how the choices were split between calls (cache hits vs fills)."""
    dtype = dtype or x.dtype
    if out is None:
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        out = torch.zeros(x.shape[0], x.shape[1], dtype=acc, device=x.device)
    deq = dequant or (lambda fid: dequantize_expert(banks, spec.fmt, fid, dtype))
    per_choice = out.dim() == 3
    if x.shape[0] == 1 and tokens_min <= 1:   # decode: no grouping needed, keep per-token work small
        for k, (fid, w) in enumerate(zip(flat_ids[0].tolist(), weights[0].tolist())):
            if fid < 0:
                continue
            y = _expert(banks, spec, fid, x.to(dtype), deq).to(out.dtype)
            if per_choice:
                out[0, k] = y[0] * w
            else:
                out.add_(y, alpha=w)
        return out
    ids = flat_ids.reshape(-1)
    order = torch.argsort(ids, stable=True)
    uniq, counts = torch.unique_consecutive(ids[order], return_counts=True)
    tokens = order // flat_ids.shape[1]
    w = weights.reshape(-1)[order]
    start = 0
    for fid, cnt in zip(uniq.tolist(), counts.tolist()):
        sl = slice(start, start + cnt)
        start += cnt
        if fid < 0 or cnt < tokens_min:
            continue
        tok = tokens[sl]
        y = _expert(banks, spec, fid, x.index_select(0, tok).to(dtype), deq)
        y = y.to(out.dtype) * w[sl].to(out.dtype).unsqueeze(1)
        if per_choice:
            out.view(-1, out.shape[-1]).index_copy_(0, order[sl], y)
        else:
            out.index_add_(0, tok, y)
    return out


def _expert(banks, spec: ExpertSpec, fid: int, x: torch.Tensor, deq) -> torch.Tensor:
    gu_w, dn_w = deq(fid)
    gu_b = banks["gate_up_bias"][fid].to(x.dtype) if "gate_up_bias" in banks else None
    dn_b = banks["down_bias"][fid].to(x.dtype) if "down_bias" in banks else None
    h = F.linear(x, gu_w, gu_b)
    I = spec.intermediate
    return F.linear(activate(h[..., :I], h[..., I:], spec.activation, spec.alpha, spec.limit), dn_w, dn_b)
