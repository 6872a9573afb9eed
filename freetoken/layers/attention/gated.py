"""Full attention of Qwen3-Next / Qwen3.5: q_proj also yields a per-head output gate,
q/k RMSNorm with (1 + w) weights, partial rotary, sigmoid(gate) on the output."""
from __future__ import annotations

import torch

from .paged import AttentionMetadata, KVCache, paged_attention
from ..linear import LinearFactory
from ..rope import Rotary


def rms_norm_1p(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm: norm(x) * (1 + w), multiplied in float32 (Qwen3-Next, Qwen3.5)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + weight.float())).to(x.dtype)


class RMSNorm1p:
    def __init__(self, weight: torch.Tensor, eps: float):
        self.weight, self.eps = weight, eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_1p(x, self.weight, self.eps)


class GatedAttention:
    def __init__(self, get, linear: LinearFactory, heads: int, kv_heads: int, head_dim: int, hidden: int,
                 eps: float, rotary: Rotary, bias: bool):
        """`get(name, shape, dtype=None)` returns this layer's tensor `self_attn.<name>` (default:
        the compute dtype); `linear` builds the projections."""
        self.hq, self.hkv, self.d, self.eps, self.rotary = heads, kv_heads, head_dim, eps, rotary
        q, kv = heads * head_dim, kv_heads * head_dim
        w = lambda n, s: get(n, s, linear.storage_dtype)  # noqa: E731
        self.q_proj = linear(w("q_proj.weight", (2 * q, hidden)),      # per head: [query | gate]
                             get("q_proj.bias", (2 * q,)) if bias else None)
        self.kv_proj = linear(torch.cat([w("k_proj.weight", (kv, hidden)), w("v_proj.weight", (kv, hidden))]),
                              torch.cat([get("k_proj.bias", (kv,)), get("v_proj.bias", (kv,))]) if bias else None)
        self.o_proj = linear(w("o_proj.weight", (hidden, q)), get("o_proj.bias", (hidden,)) if bias else None)
        self.q_norm, self.k_norm = get("q_norm.weight", (head_dim,)), get("k_norm.weight", (head_dim,))

    def __call__(self, x: torch.Tensor, cos, sin, cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        n = x.shape[0]
        q, gate = self.q_proj(x).view(n, self.hq, 2 * self.d).chunk(2, dim=-1)
        k, v = self.kv_proj(x).view(n, 2, self.hkv, self.d).unbind(1)
        q, k = rms_norm_1p(q, self.q_norm, self.eps), rms_norm_1p(k, self.k_norm, self.eps)
        q, k = self.rotary.apply(q, cos, sin), self.rotary.apply(k, cos, sin)
        o = paged_attention(q, k, v.contiguous(), cache, meta, self.d ** -0.5)
        o = o.reshape(n, -1) * torch.sigmoid(gate.reshape(n, -1))
        return self.o_proj(o)
