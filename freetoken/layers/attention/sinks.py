"""Attention with learned per-head sinks (gpt-oss): each head's softmax has one extra
logit `sink` whose probability mass is dropped, as transformers computes it. Two
sources of keys: the paged KV cache (full-attention layers) and a per-sequence sliding
window (`SlidingWindowKV`). Queries are processed in blocks so scores stay small."""
from __future__ import annotations

import torch

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
                          window: int | None = None) -> torch.Tensor:
    """q [N, Hq, D], k/v [N, Hkv, D] for the step's new tokens -> [N, Hq, D]."""
    if meta.use_paged(q):
        cache.write(meta.slot_mapping, k, v)
        out = in_place(gather_queries(q, meta), cache.k, cache.v, meta, scale, window, sinks=sinks)
        if out is not None:
            return scatter(out, meta)
    if meta.decode_kernel(q, cache.k.dtype, window):
        return decode_attention(q, k, v, cache, meta, scale, sinks.float().contiguous())
    if meta.verify_kernel(q, cache.k.dtype, window):     # each query row as its decode step computes it
        return verify_attention(q, k, v, cache, meta, scale, sinks.float().contiguous())
    queries, keys, values = gather(q, k, v, cache, meta)
    out = attend_with_sinks(queries, keys, values, meta.mask(window), sinks, scale)   # [B, Qmax, Hq, D]
    return scatter(out.transpose(1, 2).to(q.dtype), meta)


def window_attention_sinks(q, k, v, positions, past_k, past_v, past_positions, scale, sinks, window):
    """One sequence: q [T, Hq, D], k/v [T, Hkv, D] at `positions`, attending also to
    the cached past_k/v [P, Hkv, D] -> [T, Hq, D]."""
    keys = torch.cat([past_k.to(k.dtype), k]).transpose(0, 1)[None]
    values = torch.cat([past_v.to(v.dtype), v]).transpose(0, 1)[None]
    kpos = torch.cat([past_positions.to(positions.device), positions])
    qp, kp = positions[:, None], kpos[None, :]
    mask = ((kp <= qp) & (kp > qp - window))[None, None]
    return attend_with_sinks(q.transpose(0, 1)[None], keys, values, mask, sinks, scale)[0].to(q.dtype)
