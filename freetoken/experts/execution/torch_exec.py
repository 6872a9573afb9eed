"""The torch expert executors, in the kernels' arithmetic (numerics.py): activations rounded as
the C kernels round them, weights dequantized to float32, float32 accumulation.

`run_experts` is the reference: dequantize, then matmuls grouped per expert (host-side grouping).
It is the `resident` backend's compute, the CPU executor's prefill split and no-compiler path,
and the reference every faster executor is tested against (`rounding="none"` in float64 gives
the exact math).

`run_slots` is the device cache's decode executor: fixed shapes and no host sync. Every routed
(token, choice) pair gathers its expert's rows by slot id and the pairs run as batched matmuls
(`torch.bmm`), in chunks that bound the gathered float32 weights. ggml slots hold the file's
packed bytes; they are dequantized after the gather, by type on the device (ggml_slots.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import numerics
from ..formats import activate, dequantize_expert, get_format, resolve_format
from .. import ggml_slots
from ..memory.pool import ExpertSpec

GATHER_BYTES = 256 * 2**20      # float32 weights gathered at once by run_slots


def default_rounding(banks: dict[str, torch.Tensor], spec: ExpertSpec, dtype: torch.dtype,
                     tokens: int | None = None) -> str:
    """The kernels' activation rounding for these banks in a call of `tokens` tokens (float64
    references: none)."""
    if dtype == torch.float64:
        return "none"
    return numerics.rounding(spec.fmt, banks["gate_up"].dtype if "gate_up" in banks else None, tokens)


def run_experts(banks: dict[str, torch.Tensor], spec: ExpertSpec, flat_ids: torch.Tensor,
                x: torch.Tensor, weights: torch.Tensor, out: torch.Tensor | None = None, *,
                dtype: torch.dtype = torch.float32, tokens_min: int = 0, dequant=None,
                rounding: str | None = None) -> torch.Tensor:
    """out[t] += sum_k weights[t,k] * expert_{flat_ids[t,k]}(x[t]); ids < 0 are skipped.

    Computes in `dtype` (float32, the kernels' arithmetic; float64 for references) with the
    activations rounded as `rounding` says (None: as the C kernels round them for these banks)
    and returns the float32 (float64) accumulator. Only experts with at least `tokens_min`
    routed tokens are computed (the CPU executor's prefill split); `dequant(fid)` replaces
    `dequantize_expert` (the CPU executor's C dequantization).

    A 3-D `out` [T, K, H] takes each choice's weighted output at out[t, k] instead of the sum
    (written, not added): the caller sums over k in a fixed order, so the result does not
    depend on how the choices were split between calls (cache hits vs fills)."""
    mode = default_rounding(banks, spec, dtype, x.shape[0]) if rounding is None else rounding
    if out is None:
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        out = torch.zeros(x.shape[0], x.shape[1], dtype=acc, device=x.device)
    deq = dequant or (lambda fid: dequantize_expert(banks, spec.fmt, fid, dtype))
    per_choice = out.dim() == 3
    xr = numerics.round_activations(x.to(dtype), mode)
    if x.shape[0] == 1 and tokens_min <= 1:   # decode: no grouping needed, keep per-token work small
        for k, (fid, w) in enumerate(zip(flat_ids[0].tolist(), weights[0].tolist())):
            if fid < 0:
                continue
            y = _expert(banks, spec, fid, xr, deq, mode).to(out.dtype)
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
        y = _expert(banks, spec, fid, xr.index_select(0, tok), deq, mode)
        y = y.to(out.dtype) * w[sl].to(out.dtype).unsqueeze(1)
        if per_choice:
            out.view(-1, out.shape[-1]).index_copy_(0, order[sl], y)
        else:
            out.index_add_(0, tok, y)
    return out


def _expert(banks, spec: ExpertSpec, fid: int, x: torch.Tensor, deq, mode: str) -> torch.Tensor:
    """One expert over x (already rounded); float32 (float64) out."""
    gu_w, dn_w = deq(fid)
    gu_b = banks["gate_up_bias"][fid].to(x.dtype) if "gate_up_bias" in banks else None
    dn_b = banks["down_bias"][fid].to(x.dtype) if "down_bias" in banks else None
    h = F.linear(x, gu_w.to(x.dtype), gu_b)
    I = spec.intermediate
    a = numerics.round_activations(activate(h[..., :I], h[..., I:], spec.activation, spec.alpha, spec.limit), mode)
    return F.linear(a, dn_w.to(x.dtype), dn_b)


def _gather_dequant(banks, spec: ExpertSpec, slots: torch.Tensor, which: str, types) -> torch.Tensor:
    """float32 [P, rows, cols] of bank `which` ("gate_up" | "down") at `slots` (device tensor)."""
    if spec.fmt == "ggml":
        return ggml_slots.gather_dequant(banks, slots, which, spec.hidden, spec.intermediate, types)
    f = get_format(resolve_format(banks, spec.fmt))
    gk, gsk, dk, dsk = f.keys
    wk, sk = (gk, gsk) if which == "gate_up" else (dk, dsk)
    w = banks[wk].index_select(0, slots)
    if f.is_float:
        return w.to(torch.float32)
    d = f.dequantize(w, banks[sk].index_select(0, slots), torch.float32)
    return d.reshape(d.shape[0], d.shape[1], -1)


def run_slots(banks: dict[str, torch.Tensor], spec: ExpertSpec, slot_ids: torch.Tensor, x: torch.Tensor,
              weights: torch.Tensor, out: torch.Tensor, rounding: str | None = None,
              types: dict[str, tuple[int, ...]] | None = None) -> torch.Tensor:
    """out[t, k] = weights[t, k] * expert_{slot_ids[t, k]}(x[t]) for slot_ids >= 0, written into
    the float32 [T, K, H] `out` where slot_ids >= 0 (other entries untouched). Fixed shapes, no
    host sync: the same ops on every device (the CPU tests run them). ggml banks: `types` the
    pool's types per half (ggml_slots.pool_types, read once on the host; None: read from the
    banks here, a host sync)."""
    if spec.fmt == "ggml" and types is None:
        types = ggml_slots.bank_types(banks)
    mode = default_rounding(banks, spec, torch.float32, slot_ids.shape[0]) if rounding is None else rounding
    T, K = slot_ids.shape
    H, I = spec.hidden, spec.intermediate
    ids = slot_ids.reshape(-1)
    valid = ids >= 0
    safe = ids.clamp_min(0)
    xr = numerics.round_activations(x.to(torch.float32), mode)
    tok = torch.arange(T * K, device=ids.device) // K
    w = (weights.reshape(-1).to(torch.float32) * valid).unsqueeze(1)
    flat_out = out.view(T * K, H)
    per_pair = 3 * I * H * 4 * ggml_slots.type_count(types)     # a mix: a float copy per type at once
    chunk = max(1, GATHER_BYTES // per_pair)
    for s in range(0, T * K, chunk):        # host loop over a shape known on the host
        sl = slice(s, min(T * K, s + chunk))
        sid = safe[sl]
        xs = xr.index_select(0, tok[sl]).unsqueeze(2)                   # [P, H, 1]
        h = torch.bmm(_gather_dequant(banks, spec, sid, "gate_up", types), xs).squeeze(2)
        if "gate_up_bias" in banks:
            h = h + banks["gate_up_bias"].index_select(0, sid).to(torch.float32)
        a = numerics.round_activations(activate(h[:, :I], h[:, I:], spec.activation, spec.alpha, spec.limit), mode)
        y = torch.bmm(_gather_dequant(banks, spec, sid, "down", types), a.unsqueeze(2)).squeeze(2)
        if "down_bias" in banks:
            y = y + banks["down_bias"].index_select(0, sid).to(torch.float32)
        y = y * w[sl]
        flat_out[sl] = torch.where(valid[sl].unsqueeze(1), y, flat_out[sl])
    return out
