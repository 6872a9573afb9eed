"""Causal prefill attention without a [queries, keys] mask.

A prefill chunk's queries are the last Q positions of its sequence's K keys. Its attention is
two unmasked-or-plain-causal pieces merged by their log-sum-exp: the Q queries over the K - Q
earlier keys (all visible: no mask, and the G query heads that share a KV head are folded into
the query axis so the keys are never repeated), and the Q x Q diagonal block (plain causal).
torch's CPU flash attention runs both blockwise, so nothing of size Q x K is materialized: the
boolean mask alone is 32 MB per layer for a 2048-token chunk at 16k context, and SDPA with a mask
takes a slower path than without. Each sequence of a batch is done on its own.

dtype: the dtype the flash kernel multiplies in; bf16 where native bf16 GEMM was measured faster
(kernels/choices.py) reads a bf16 KV cache as it is instead of converting it to fp32.

In bf16, with the C kernels' pool and the library's prefill attention switched on (calibrated,
kernels/choices.py), a chunk runs kernels/c/prefill_attention.c instead: the same two pieces in
one pass on AMX tiles, the keys read where the gather left them (no contiguous copy), fp32 out.
The kernel also takes gpt-oss's learned sinks and sliding window (torch's flash kernel has neither:
there the caller keeps its masked path)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

_flash = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def available() -> bool:
    return _flash is not None


def tiles_chunk(pool, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
              out: torch.Tensor | None = None, sinks: torch.Tensor | None = None, window: int | None = None
              ) -> torch.Tensor | None:
    """causal_chunk on AMX tiles: q [1, Hq, Q, D], k/v [1, Hkv, K, D] bf16 (any head/token strides)
    -> fp32 [1, Hq, Q, D] (into `out` where given: fp32, any head/token strides), or None where the
    library does not run it (switched off, no AMX, a head dim not a multiple of 32 up to 256).
    sinks: [Hq] logits joining each head's softmax (gpt-oss); window: the keys a query sees, itself
    included (None: all before it)."""
    if q.dtype != torch.bfloat16 or k.dtype != torch.bfloat16 or v.dtype != torch.bfloat16:
        return None
    _, hq, nq, d = q.shape
    target = out
    if out is None or out.dtype != torch.float32 or out.stride(-1) != 1:
        out = torch.empty(1, hq, nq, d)
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        return None
    if sinks is not None:
        sinks = sinks.float().contiguous()
    with pool.lock:
        rc = pool.lib.ft_prefill_attention_sinks(
            pool.handle, q.data_ptr(), q.stride(1), q.stride(2), nq, hq, k.shape[1], d, k.data_ptr(), k.stride(1),
            k.stride(2), v.data_ptr(), v.stride(1), v.stride(2), k.shape[2], scale, out.data_ptr(), out.stride(1),
            out.stride(2), sinks.data_ptr() if sinks is not None else None, window or 0)
    if rc < 0:
        raise MemoryError("prefill attention kernel could not allocate its scratch memory")
    if rc != 0:
        return None
    if target is not None and target is not out:
        target.copy_(out)
    return out


def _attend(q, k, v, scale, causal):
    out, lse = _flash(q, k, v, 0.0, causal, scale=scale)[:2]
    return out, lse


def causal_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [1, Hq, Q, D] at the last Q of the K positions of k/v [1, Hkv, K, D] -> [1, Hq, Q, D]."""
    _, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    g = hq // hkv
    past = nk - nq
    diag_k, diag_v = k[:, :, past:], v[:, :, past:]
    if g > 1:
        diag_k, diag_v = diag_k.repeat_interleave(g, 1), diag_v.repeat_interleave(g, 1)
    o2, l2 = _attend(q, diag_k, diag_v, scale, True)
    if past == 0:
        return o2
    o1, l1 = _attend(q.reshape(1, hkv, g * nq, d), k[:, :, :past], v[:, :, :past], scale, False)
    o1, l1 = o1.reshape(1, hq, nq, d), l1.reshape(1, hq, nq)
    m = torch.maximum(l1, l2)
    a, b = torch.exp(l1 - m), torch.exp(l2 - m)
    inv = 1.0 / (a + b)
    return (o1.float() * (a * inv).unsqueeze(-1) + o2.float() * (b * inv).unsqueeze(-1)).to(q.dtype)


def causal_batch(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, q_lens: list[int],
                 k_lens: list[int], scale: float, dtype: torch.dtype, pool=None, sinks: torch.Tensor | None = None,
                 window: int | None = None) -> torch.Tensor | None:
    """queries [B, Hq, Qmax, D], keys/values [B, Hkv, Kmax, D] padded per sequence; sequence i has
    q_lens[i] queries at the last positions of its k_lens[i] keys. Returns [B, Hq, Qmax, D] in
    queries' dtype (padded query rows zero). pool: the C kernels' pool (tiles_chunk), or None.
    With sinks or a window (tiles_chunk's) only the library's kernel runs it: None where it does not."""
    out = queries.new_zeros(queries.shape)
    plain = sinks is None and not window
    for i, (nq, nk) in enumerate(zip(q_lens, k_lens)):
        if nq == 0:
            continue
        q = queries[i:i + 1, :, :nq].to(dtype)
        k, v = keys[i:i + 1, :, :nk].to(dtype), values[i:i + 1, :, :nk].to(dtype)
        if pool is not None and (nq > 1 or not plain) and tiles_chunk(
                pool, q, k, v, scale, out[i:i + 1, :, :nq], sinks, window) is not None:
            continue
        if not plain:
            return None
        if nq == 1:       # one decode token: every key is visible
            o = F.scaled_dot_product_attention(q.contiguous(), k, v, scale=scale, enable_gqa=k.shape[1] != q.shape[1])
        else:
            o = causal_chunk(q.contiguous(), k.contiguous(), v.contiguous(), scale)
        out[i, :, :nq] = o[0].to(out.dtype)
    return out
