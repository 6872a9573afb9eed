"""Attention over a paged KV cache.

The runner describes one engine step as `AttentionMetadata`: where each new token's K/V
is written (`slot_mapping`) and, per sequence in the batch, which cache slots hold its
keys (`key_slots`, padded with the null slot 0) and which flat tokens are its queries
(`query_index`, padded with a dummy row). Attention is then one batched SDPA with a
boolean mask, so prefill chunks and decode tokens of many sequences run in one call.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor      # [N] cache slot of each new token
    key_slots: torch.Tensor         # [B, Kmax] cache slots of each sequence's keys (0 = null)
    key_positions: torch.Tensor     # [B, Kmax] position of each key (huge for padding)
    query_index: torch.Tensor       # [B, Qmax] flat token index of each query (N = dummy)
    query_positions: torch.Tensor   # [B, Qmax] position of each query (-1 for padding)
    num_tokens: int
    _masks: dict = field(default_factory=dict)

    def mask(self, window: int | None = None) -> torch.Tensor:
        """[B, 1, Qmax, Kmax] True where a query may attend a key (causal, optional window)."""
        m = self._masks.get(window)
        if m is None:
            q = self.query_positions.unsqueeze(-1)
            k = self.key_positions.unsqueeze(-2)
            m = k <= q
            if window is not None:
                m &= k > q - window
            m[..., 0] |= self.query_positions < 0   # padded queries attend the null slot, never NaN
            m = self._masks[window] = m.unsqueeze(1)
        return m

    @property
    def single_prefill(self) -> bool:
        return self.key_slots.shape[0] == 1


class KVCache:
    """K and V for one attention layer: [num_slots, kv_heads, head_dim]; slot 0..block_size-1 is the null block."""

    def __init__(self, num_slots: int, kv_heads: int, head_dim: int, dtype, device):
        self.k = torch.zeros(num_slots, kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros(num_slots, kv_heads, head_dim, dtype=dtype, device=device)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache,
                    meta: AttentionMetadata, scale: float, window: int | None = None) -> torch.Tensor:
    """q [N, Hq, D], k/v [N, Hkv, D] for the step's new tokens -> [N, Hq, D]."""
    cache.k.index_copy_(0, meta.slot_mapping, k)
    cache.v.index_copy_(0, meta.slot_mapping, v)
    keys = cache.k[meta.key_slots].transpose(1, 2)      # [B, Hkv, Kmax, D]
    values = cache.v[meta.key_slots].transpose(1, 2)
    n, hq, d = q.shape
    q_pad = torch.cat([q, q.new_zeros(1, hq, d)]) if meta.query_index.numel() != n else q
    queries = q_pad[meta.query_index].transpose(1, 2)   # [B, Hq, Qmax, D]
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=meta.mask(window),
                                         scale=scale, enable_gqa=keys.shape[1] != hq)
    out = out.transpose(1, 2)                           # [B, Qmax, Hq, D]
    if meta.query_index.numel() == n:
        return out.reshape(n, hq, d) if meta.key_slots.shape[0] == 1 else _scatter(out, meta, n)
    return _scatter(out, meta, n)


def _scatter(out: torch.Tensor, meta: AttentionMetadata, n: int) -> torch.Tensor:
    flat = out.new_empty(n + 1, out.shape[2], out.shape[3])
    flat[meta.query_index.reshape(-1)] = out.reshape(-1, out.shape[2], out.shape[3])
    return flat[:n]
