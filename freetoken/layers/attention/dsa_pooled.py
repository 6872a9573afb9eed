"""GLM-5.3-Flash's DSA indexer: NoPE, and it scores pools of keys instead of single keys.

Consecutive keys form pools of `index_kpool` (from position 0). A complete pool has one
pooled key, a softmax-weighted mean of its tokens' indexer keys per channel:
  key_p = sum_t softmax_t(gate_t + ape_t) * k_t,  gate_t = index_kpool_compress_gate x_t,
so each token's cache row carries [k_t | gate_t] after MLA's latent. A query scores the
pools whose last token it can see, I = sum_h w_h relu(scale q_h . key_p) (as `dsa.Indexer`),
keeps the best `index_topk / index_kpool`, and attends all their tokens plus the visible
tokens of its own incomplete pool (the tail). Scores are fp32, as in transformers."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...errors import CheckpointError
from .paged import AttentionMetadata, gather_queries, gather_rows
from .dsa import Selection
from ..linear import Linear, LinearFactory


class PooledIndexer:
    last: Selection | None = None      # this step's choice, for "shared" layers that reuse it

    def __init__(self, ck, p: str, hf, linear: LinearFactory, dtype, device):
        """Weights `{p}.wq_b`, `wk`, `k_norm` (LayerNorm), `weights_proj`, `index_kpool_compress_gate`
        [D, hidden] and `index_kpool_compress_ape` [kpool, D]."""
        self.heads, self.dim, self.topk = hf.req("index_n_heads"), hf.req("index_head_dim"), hf.req("index_topk")
        self.kpool = hf.first("index_kpool", default=16)
        if self.kpool < 1 or self.topk % self.kpool:
            raise CheckpointError(f"{hf.path}: index_topk {self.topk} must be a multiple of index_kpool {self.kpool}")
        if not hf.get("index_kpool_always_select_tail", True):
            raise CheckpointError(f"{hf.path}: field 'index_kpool_always_select_tail' is false; only true "
                                  "(queries always attend their incomplete pool) is supported")
        hidden, q_lora = hf.req("hidden_size"), hf.req("q_lora_rank")
        self.scale = self.dim ** -0.5
        self.wq_b = linear.load(ck, [f"{p}.wq_b.weight"], [(self.heads * self.dim, q_lora)], device=device)
        self.wk = linear.load(ck, [f"{p}.wk.weight"], [(self.dim, hidden)], device=device)
        self.gate = linear(ck.get_float(f"{p}.index_kpool_compress_gate", (self.dim, hidden),
                                        linear.storage_dtype).to(device))
        self.ape = ck.get_float(f"{p}.index_kpool_compress_ape", (self.kpool, self.dim)).to(device)
        self.k_norm_w = ck.get_float(f"{p}.k_norm.weight", (self.dim,), dtype).to(device)
        self.k_norm_b = ck.get_float(f"{p}.k_norm.bias", (self.dim,), dtype).to(device)
        self.weights_proj = Linear(ck.get_float(f"{p}.weights_proj.weight", (self.heads, hidden)).to(device),
                                   compute_dtype=torch.float32, storage_dtype=torch.float32, pool=linear.pool)

    @property
    def row(self) -> int:
        """Cache values per token: indexer key and pool gate."""
        return 2 * self.dim

    def keys(self, x: torch.Tensor, cos=None, sin=None) -> torch.Tensor:
        """[k | gate] [N, 2 * index_head_dim] of the new tokens."""
        k = F.layer_norm(self.wk(x), (self.dim,), self.k_norm_w, self.k_norm_b, 1e-6)
        return torch.cat([k, self.gate(x).to(k.dtype)], dim=-1)

    def pooled_keys(self, rows: torch.Tensor, num_pools: int) -> torch.Tensor:
        """rows [B, K, 2D] (fp32) -> one key per complete pool [B, P, D]."""
        b, kp, d = rows.shape[0], self.kpool, self.dim
        r = rows[:, :num_pools * kp].view(b, num_pools, kp, 2 * d)
        probs = torch.softmax(r[..., d:] + self.ape.float(), dim=2)
        return (probs * r[..., :d]).sum(dim=2)

    def select(self, x: torch.Tensor, q_latent: torch.Tensor, cos, sin, rows: torch.Tensor, offset: int,
               meta: AttentionMetadata) -> Selection:
        """Chosen keys per query; `rows[..., offset:]` hold [k | gate]; key column c is position c."""
        n, kp = x.shape[0], self.kpool
        cached = gather_rows(rows, meta)[:, :, 0, offset:offset + self.row].float()      # [B, K, 2D]
        b, kmax = cached.shape[:2]
        num_pools = kmax // kp            # a pool past the last full block of columns is never visible
        qpos = meta.query_positions.unsqueeze(-1)                                        # [B, Q, 1]
        picked = torch.zeros(b, qpos.shape[1], num_pools, dtype=torch.bool, device=x.device)
        select_k = min(self.topk // kp, num_pools)
        if select_k:
            q = self.wq_b(q_latent).view(n, self.heads, self.dim).float()
            pooled = self.pooled_keys(cached, num_pools)
            scores = F.relu(torch.matmul(gather_queries(q, meta), pooled.unsqueeze(1).transpose(-1, -2)) * self.scale)
            w = self.weights_proj(x.float()).float() * self.heads ** -0.5               # [N, H]
            w = gather_queries(w[:, None], meta)[:, 0]                                   # [B, Q, H]
            index = torch.matmul(w.unsqueeze(-2), scores.transpose(1, 2)).squeeze(-2)    # [B, Q, P]
            ends = torch.arange(num_pools, device=x.device) * kp + kp - 1
            visible = ends <= qpos
            top = index.masked_fill(~visible, float("-inf")).topk(select_k, dim=-1).indices
            picked.scatter_(-1, top, visible.gather(-1, top))
        col = torch.arange(kmax, device=x.device)
        chosen = F.pad(picked.repeat_interleave(kp, dim=-1), (0, kmax - num_pools * kp))
        tail = (col // kp == qpos // kp) & (col <= qpos) & ((qpos + 1) % kp != 0)
        mask = chosen | tail
        mask[..., 0] |= meta.query_positions < 0            # padded queries attend the null slot, never NaN
        top = count = None
        if mask.shape[1] == 1:           # decode: the chosen columns first, for the C kernel
            count = mask.sum(-1)
            top = torch.argsort((~mask).to(torch.int8), dim=-1, stable=True)[..., :max(1, int(count.max()))]
        self.last = Selection(mask.unsqueeze(1), top, count)
        return self.last
