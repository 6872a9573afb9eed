"""DeepSeek sparse attention (DSA, DeepSeek-V3.2 / GLM-5): a lightning indexer scores every
past token for each query and MLA attends only the `index_topk` best.

The indexer has its own small key per token (`index_head_dim` values, LayerNorm'd, rope on
the first `qk_rope_head_dim`, half-split, not interleaved). It is stored at the end of the
layer's latent cache row, [c | k_rope | index key], so it pages, shares prefixes and is
freed with the latent it belongs to. Score of key t for query s:
  I[s, t] = sum_h w[s, h] * relu(scale * q[s, h] . k[t]),  w = weights_proj(x) / sqrt(H).
The Hadamard rotation and FP8 scoring of the original kernels only change precision (the
rotation is orthogonal), as in transformers' reference, which is what we match."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .paged import AttentionMetadata, gather_queries, gather_rows
from ..linear import Linear, LinearFactory
from ..rope import Rotary


@dataclass
class Selection:
    """The indexer's choice for one step: mask [B, 1, Qmax, Kmax] (True = attend, causal
    included) and the chosen key columns top [B, Qmax, k], best first. `count` [B, Qmax]: how
    many leading columns of `top` are chosen, where that varies by query (pooled selection)."""
    mask: torch.Tensor
    top: torch.Tensor
    count: torch.Tensor | None = None


class Indexer:
    last: Selection | None = None      # this step's choice, for GLM-5 layers that reuse it

    def __init__(self, ck, p: str, hf, linear: LinearFactory, rotary: Rotary, dtype, device,
                 rope_interleave: bool = False):
        """Weights `{p}.wq_b`, `wk`, `k_norm` (LayerNorm weight and bias), `weights_proj` (fp32).
        `rope_interleave`: the rope dims are (x0, x1) pairs (GLM-5) instead of halves (V3.2)."""
        self.interleave = rope_interleave
        self.heads, self.dim = hf.req("index_n_heads"), hf.req("index_head_dim")
        self.rope, self.topk = hf.req("qk_rope_head_dim"), hf.req("index_topk")
        hidden, q_lora = hf.req("hidden_size"), hf.req("q_lora_rank")
        self.rotary, self.scale = rotary, self.dim ** -0.5
        self.wq_b = linear.load(ck, [f"{p}.wq_b.weight"], [(self.heads * self.dim, q_lora)], device=device)
        self.wk = linear.load(ck, [f"{p}.wk.weight"], [(self.dim, hidden)], device=device)
        self.k_norm_w = ck.get_float(f"{p}.k_norm.weight", (self.dim,), dtype).to(device)
        self.k_norm_b = ck.get_float(f"{p}.k_norm.bias", (self.dim,), dtype).to(device)
        # head weights stay fp32 (the reference keeps weights_proj in fp32)
        self.weights_proj = Linear(ck.get_float(f"{p}.weights_proj.weight", (self.heads, hidden)).to(device),
                                   compute_dtype=torch.float32, storage_dtype=torch.float32, pool=linear.pool)

    def _rope(self, x: torch.Tensor, cos, sin) -> torch.Tensor:
        rot = x[..., :self.rope]
        if self.interleave:      # pairs -> halves: the same permutation of q and k keeps every q . k
            rot = torch.cat([rot[..., 0::2], rot[..., 1::2]], dim=-1)
        return torch.cat([self.rotary.apply(rot.contiguous(), cos, sin), x[..., self.rope:]], dim=-1)

    def keys(self, x: torch.Tensor, cos, sin) -> torch.Tensor:
        """Indexer keys [N, index_head_dim] of the new tokens."""
        k = F.layer_norm(self.wk(x), (self.dim,), self.k_norm_w, self.k_norm_b, 1e-6)
        return self._rope(k[:, None], cos, sin)[:, 0]

    def select(self, x: torch.Tensor, q_latent: torch.Tensor, cos, sin, rows: torch.Tensor, offset: int,
               meta: AttentionMetadata) -> Selection:
        """Top-k keys per query among its causal keys; `rows[..., offset:]` hold the indexer keys."""
        n = x.shape[0]
        q = self._rope(self.wq_b(q_latent).view(n, self.heads, self.dim), cos, sin).float()
        keys = gather_rows(rows, meta)[:, :, 0, offset:].float()                   # [B, K, D]
        queries = gather_queries(q, meta)                                           # [B, H, Q, D]
        scores = F.relu(torch.matmul(queries, keys.unsqueeze(1).transpose(-1, -2)) * self.scale)  # [B, H, Q, K]
        w = self.weights_proj(x.float()).float() * self.heads ** -0.5              # [N, H]
        w = gather_queries(w[:, None], meta)[:, 0]                                  # [B, Q, H]
        index = torch.matmul(w.unsqueeze(-2), scores.transpose(1, 2)).squeeze(-2)   # [B, Q, K]
        causal = meta.mask()[:, 0]
        index = index.masked_fill(~causal, float("-inf"))
        top = index.topk(min(self.topk, index.shape[-1]), dim=-1).indices
        chosen = torch.zeros_like(causal).scatter_(-1, top, True) & causal
        self.last = Selection(chosen.unsqueeze(1), top)
        return self.last


class SharedSelection:
    """A GLM-5 "shared" DSA layer: no indexer weights and no indexer keys in its cache rows; it
    attends the keys the previous full layer's indexer chose for the same queries in this step."""

    def __init__(self, source: Indexer):
        self.source = source

    def keys(self, x: torch.Tensor, cos, sin) -> torch.Tensor:
        return x.new_empty(x.shape[0], 0)

    def select(self, *args) -> Selection:
        return self.source.last
