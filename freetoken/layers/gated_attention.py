"""Full attention of Qwen3-Next / Qwen3.5: q_proj also yields a per-head output gate,
q/k RMSNorm with (1 + w) weights, partial rotary, sigmoid(gate) on the output."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .attention import AttentionMetadata, KVCache, paged_attention
from .rope import Rotary


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
    def __init__(self, get, heads: int, kv_heads: int, head_dim: int, hidden: int, eps: float,
                 rotary: Rotary, bias: bool):
        """`get(name, shape)` returns this layer's tensor `self_attn.<name>` in the model dtype."""
        self.hq, self.hkv, self.d, self.eps, self.rotary = heads, kv_heads, head_dim, eps, rotary
        q, kv = heads * head_dim, kv_heads * head_dim
        self.q_proj = get("q_proj.weight", (2 * q, hidden))      # per head: [query | gate]
        self.kv_proj = torch.cat([get("k_proj.weight", (kv, hidden)), get("v_proj.weight", (kv, hidden))])
        self.o_proj = get("o_proj.weight", (hidden, q))
        self.q_bias = get("q_proj.bias", (2 * q,)) if bias else None
        self.kv_bias = torch.cat([get("k_proj.bias", (kv,)), get("v_proj.bias", (kv,))]) if bias else None
        self.o_bias = get("o_proj.bias", (hidden,)) if bias else None
        self.q_norm, self.k_norm = get("q_norm.weight", (head_dim,)), get("k_norm.weight", (head_dim,))

    def __call__(self, x: torch.Tensor, cos, sin, cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        n = x.shape[0]
        q, gate = F.linear(x, self.q_proj, self.q_bias).view(n, self.hq, 2 * self.d).chunk(2, dim=-1)
        k, v = F.linear(x, self.kv_proj, self.kv_bias).view(n, 2, self.hkv, self.d).unbind(1)
        q, k = rms_norm_1p(q, self.q_norm, self.eps), rms_norm_1p(k, self.k_norm, self.eps)
        q, k = self.rotary.apply(q, cos, sin), self.rotary.apply(k, cos, sin)
        o = paged_attention(q, k, v.contiguous(), cache, meta, self.d ** -0.5)
        o = o.reshape(n, -1) * torch.sigmoid(gate.reshape(n, -1))
        return F.linear(o, self.o_proj, self.o_bias)
