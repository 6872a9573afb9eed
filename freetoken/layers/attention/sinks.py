"""Attention with learned per-head sinks (gpt-oss): each head's softmax has one extra
logit `sink` whose probability mass is dropped, as transformers computes it. Two
sources of keys: the paged KV cache (full-attention layers) and a per-sequence sliding
window (`SlidingWindowKV`). Queries are processed in blocks so scores stay small. On the CPU a
prefill runs the library's prefill attention kernel (prefill.py's tiles_chunk: sinks and the window
in its tiles) where it is switched on; this masked fp32 path where it is not."""
from __future__ import annotations

import torch

from . import prefill
from .paged import (AttentionMetadata, KVCache, decode_attention, gather, gather_queries, in_place, scatter,
                    verify_attention)

QUERY_BLOCK = 256


def attend_with_sinks(queries, keys, values, mask, sinks, scale):
    """queries [B, Hq, Q, D]; keys/values [B, Hkv, K, D]; mask [B, 1, Q, K] -> [B, Q, Hq, D] (float32)."""
    hq = queries.shape[1]
    rep = hq // keys.shape[1]
    queries, keys, values = queries.float(), keys.float(), values.float()
    if rep > 1:
        keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
    sink = sinks.float().view(1, hq, 1, 1)
    out = queries.new_empty(*queries.shape[:3], values.shape[-1])
    for s in range(0, queries.shape[2], QUERY_BLOCK):
        blk = slice(s, s + QUERY_BLOCK)
        scores = (queries[:, :, blk] @ keys.transpose(-1, -2)) * scale
        scores = scores.masked_fill(~mask[:, :, blk], float("-inf"))
        logits = torch.cat([scores, sink.expand(*scores.shape[:-1], 1)], dim=-1)
        logits = logits - logits.amax(dim=-1, keepdim=True)
        out[:, :, blk] = torch.softmax(logits, dim=-1)[..., :-1] @ values
    return out.transpose(1, 2)


def paged_attention_sinks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache,
                          meta: AttentionMetadata, scale: float, sinks: torch.Tensor,
                          window: int | None = None, prefill_dtype: torch.dtype | None = None) -> torch.Tensor:
    """q [N, Hq, D], k/v [N, Hkv, D] for the step's new tokens -> [N, Hq, D]. prefill_dtype: what
    the CPU prefill kernel multiplies in (default q's dtype; it runs bf16 only)."""
    if meta.use_paged(q):
        cache.write(meta.slot_mapping, k, v)
        out = in_place(gather_queries(q, meta), cache.k, cache.v, meta, scale, window, sinks=sinks)
        if out is not None:
            return scatter(out, meta)
    if meta.decode_kernel(q, cache.k.dtype, window):
        return decode_attention(q, k, v, cache, meta, scale, sinks.float().contiguous())
    if meta.verify_kernel(q, cache.k.dtype, window):     # each query row as its decode step computes it
        return verify_attention(q, k, v, cache, meta, scale, sinks.float().contiguous())
    queries, keys, values = gather(q, k, v, cache, meta, convert=False)
    if q.device.type == "cpu" and meta.kernel_pool is not None and meta.context_lens is not None:
        q_lens = (meta.query_positions >= 0).sum(1).tolist()
        out = prefill.causal_batch(queries, keys, values, q_lens, meta.context_lens.tolist(), scale,
                                   prefill_dtype or q.dtype, meta.kernel_pool, sinks, window)
        if out is not None:
            return scatter(out, meta)
    keys, values = keys.to(q.dtype), values.to(q.dtype)
    out = attend_with_sinks(queries, keys, values, meta.mask(window), sinks, scale)   # [B, Qmax, Hq, D]
    return scatter(out.transpose(1, 2).to(q.dtype), meta)


def window_attention_sinks(q, k, v, positions, past_k, past_v, past_positions, scale, sinks, window,
                           pool=None, dtype: torch.dtype | None = None):
    """One sequence: q [T, Hq, D], k/v [T, Hkv, D] at `positions`, attending also to
    the cached past_k/v [P, Hkv, D] (the P positions just before) -> [T, Hq, D]. pool: the C
    kernels' pool, the prefill kernel's (tiles_chunk) in `dtype` where it runs."""
    if pool is not None:
        dt = dtype or q.dtype
        out = torch.empty(q.shape, dtype=torch.float32)
        keys = torch.cat([past_k.to(dt), k.to(dt)]).transpose(0, 1)[None]
        values = torch.cat([past_v.to(dt), v.to(dt)]).transpose(0, 1)[None]
        if prefill.tiles_chunk(pool, q.to(dt).transpose(0, 1)[None], keys, values, scale, out.transpose(0, 1)[None],
                               sinks, window) is not None:
            return out.to(q.dtype)
    keys = torch.cat([past_k.to(k.dtype), k]).transpose(0, 1)[None]
    values = torch.cat([past_v.to(v.dtype), v]).transpose(0, 1)[None]
    kpos = torch.cat([past_positions.to(positions.device), positions])      # ascending
    qt, out = q.transpose(0, 1)[None], q.new_empty(q.shape, dtype=torch.float32)
    for s in range(0, q.shape[0], QUERY_BLOCK):     # each block against its window's keys only
        qp = positions[s:s + QUERY_BLOCK, None]
        lo, hi = int(torch.searchsorted(kpos, qp[0] - window + 1)), int(torch.searchsorted(kpos, qp[-1], right=True))
        kp = kpos[None, lo:hi]
        mask = ((kp <= qp) & (kp > qp - window))[None, None]
        out[s:s + QUERY_BLOCK] = attend_with_sinks(qt[:, :, s:s + QUERY_BLOCK], keys[:, :, lo:hi], values[:, :, lo:hi],
                                                   mask, sinks, scale)[0]
    return out.to(q.dtype)
