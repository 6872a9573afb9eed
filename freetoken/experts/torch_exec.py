"""Expert execution with plain torch ops, grouped per expert. This is the `resident`
backend's compute and the reference every faster executor is tested against."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .pool import ExpertSpec


def activate(gate_up: torch.Tensor, spec: ExpertSpec) -> torch.Tensor:
    """[.., 2I] gate then up -> [.., I]."""
    gate, up = gate_up[..., : spec.intermediate], gate_up[..., spec.intermediate:]
    if spec.activation == "silu":
        return F.silu(gate) * up
    if spec.activation == "silu_clamp":
        return F.silu(gate.clamp(max=spec.limit)) * up.clamp(min=-spec.limit, max=spec.limit)
    if spec.activation == "swiglu_oai":
        gate = gate.clamp(max=spec.limit)
        up = up.clamp(min=-spec.limit, max=spec.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * spec.alpha))
    raise ValueError(f"unknown expert activation {spec.activation!r}")


def dequantized(banks: dict[str, torch.Tensor], fid: int, spec: ExpertSpec, dtype: torch.dtype):
    """(gate_up [2I, H], down [H, I]) of one expert in `dtype`."""
    if spec.fmt == "float":
        return banks["gate_up"][fid].to(dtype), banks["down"][fid].to(dtype)
    from .cpu import dequantize_expert      # one dequantizer per format, shared with the CPU reference
    gu, dn = dequantize_expert(banks, spec.fmt, fid, dtype)
    return gu.reshape(gu.shape[0], -1), dn.reshape(dn.shape[0], -1)


def run_experts(banks: dict[str, torch.Tensor], spec: ExpertSpec, flat_ids: torch.Tensor,
                x: torch.Tensor, weights: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """out[t] += sum_k weights[t,k] * expert_{flat_ids[t,k]}(x[t]); ids < 0 are skipped.
    Accumulates in float32; returns the float32 [T, H] accumulator."""
    if out is None:
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    if x.shape[0] == 1:                      # decode: no grouping needed, keep per-token work small
        return _run_single(banks, spec, flat_ids[0].tolist(), x, weights[0].float().tolist(), out)
    ids = flat_ids.reshape(-1)
    order = torch.argsort(ids, stable=True)
    sorted_ids = ids[order]
    uniq, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
    k = flat_ids.shape[1]
    tokens = order // k
    w = weights.reshape(-1)[order]
    has_bias = "gate_up_bias" in banks
    start = 0
    for fid, cnt in zip(uniq.tolist(), counts.tolist()):
        sl = slice(start, start + cnt)
        start += cnt
        if fid < 0:
            continue
        tok = tokens[sl]
        xs = x.index_select(0, tok)
        gu_w, dn_w = dequantized(banks, fid, spec, x.dtype)
        h = F.linear(xs, gu_w, banks["gate_up_bias"][fid].to(x.dtype) if has_bias else None)
        y = F.linear(activate(h, spec), dn_w, banks["down_bias"][fid].to(x.dtype) if has_bias else None)
        out.index_add_(0, tok, y.float() * w[sl].float().unsqueeze(1))
    return out


def _run_single(banks, spec, fids: list[int], x, ws: list[float], out):
    has_bias = "gate_up_bias" in banks
    for fid, w in zip(fids, ws):
        if fid < 0:
            continue
        gu_w, dn_w = dequantized(banks, fid, spec, x.dtype)
        h = F.linear(x, gu_w, banks["gate_up_bias"][fid].to(x.dtype) if has_bias else None)
        y = F.linear(activate(h, spec), dn_w, banks["down_bias"][fid].to(x.dtype) if has_bias else None)
        out.add_(y.float(), alpha=w)
    return out
