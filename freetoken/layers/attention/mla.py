"""Multi-head latent attention (DeepSeek-V2/V3/V3.2, GLM-5) over a latent paged cache.

Each token keeps one cache row, [kv_lora_rank normalised latent c | qk_rope_head_dim rotated
shared key], instead of per-head K and V (576 values per token on DeepSeek-V3 instead of
2 x 128 heads x 192). Keys and values are derived from c by `kv_b_proj`:
  k_h = [W_kb,h c | k_rope],  v_h = W_vb,h c.
Prefill expands c into per-head keys/values (cheap per key, many queries). Decode absorbs
W_kb into the query and W_vb into the output instead, so attention reads the cached rows
as one shared head:  q_h . k_h = (W_kb,h^T q_nope,h) . c + q_rope,h . k_rope  and
o_h = W_vb,h (sum_j p_j c_j).  On the CPU that is the C decode kernel over the rows in place.

With a DSA `indexer` (V3.2) each query attends only the keys the indexer selects; see `layers/attention/dsa.py`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .paged import (AttentionMetadata, KVCache, attend_rows, gather_queries, gather_rows, in_flat_order, in_place,
                    masked_sdpa, scatter, verify_rows)
from ..kernel_rows import GEMV_TOKENS
from ..linear import LinearFactory
from ..norm import RMSNorm
from ..rope import Rotary, rope_parameters


def row_einsum(eq: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """einsum(eq, x [n, ...], w) one row of x at a time for a decode/verify step's few rows on
    the CPU: torch's GEMM of n rows may round unlike its one-row call, and a row's bits must not
    depend on the rows beside it (batched decode, verify rows == decode steps)."""
    if x.device.type != "cpu" or x.shape[0] <= 1 or x.shape[0] > GEMV_TOKENS:
        return torch.einsum(eq, x, w)
    return torch.cat([torch.einsum(eq, x[i:i + 1], w) for i in range(x.shape[0])])


@dataclass(frozen=True)
class MLAConfig:
    hidden: int
    heads: int
    q_lora_rank: int | None      # None: one q_proj
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool        # rope dims stored as (x0, x1), (x2, x3) pairs
    bias: bool                   # attention_bias: q_a/kv_a/o biases
    scale: float                 # softmax scale, YaRN mscale^2 included

    @classmethod
    def from_hf(cls, hf) -> "MLAConfig":
        nope, rope = hf.req("qk_nope_head_dim"), hf.req("qk_rope_head_dim")
        scale = (nope + rope) ** -0.5
        params = rope_parameters(hf.data)
        if params["rope_type"] != "default" and params.get("mscale_all_dim"):
            m = 0.1 * params["mscale_all_dim"] * math.log(params["factor"]) + 1.0 if params["factor"] > 1 else 1.0
            scale *= m * m
        q_lora = hf.get("q_lora_rank")
        return cls(hidden=hf.req("hidden_size"), heads=hf.req("num_attention_heads"),
                   q_lora_rank=int(q_lora) if q_lora else None, kv_lora_rank=hf.req("kv_lora_rank"),
                   qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=hf.req("v_head_dim"),
                   rope_interleave=bool(hf.get("rope_interleave", True)), bias=bool(hf.get("attention_bias", False)),
                   scale=scale)

    @property
    def row(self) -> int:
        """Cache values per token."""
        return self.kv_lora_rank + self.qk_rope_head_dim


class MLA:
    def __init__(self, ck, p: str, c: MLAConfig, linear: LinearFactory, rotary: Rotary, dtype, device,
                 latent_eps: float = 1e-6):
        """Weights `{p}.q_a_proj`, `q_a_layernorm`, `q_b_proj` (or `q_proj`), `kv_a_proj_with_mqa`,
        `kv_a_layernorm`, `kv_b_proj`, `o_proj`; FP8 block-scaled ones are read as shipped."""
        self.c, self.rotary = c, rotary
        h, qk = c.heads, c.qk_nope_head_dim + c.qk_rope_head_dim
        bias = (lambda n, o: ck.get_float(f"{p}.{n}.bias", (o,), dtype).to(device)) if c.bias else (lambda n, o: None)
        norm = lambda n, d: RMSNorm(ck.get_float(f"{p}.{n}.weight", (d,), dtype).to(device), latent_eps)  # noqa: E731
        lin = lambda n, o, i, b=None: linear.load(ck, [f"{p}.{n}.weight"], [(o, i)], b, device=device)  # noqa: E731
        if c.q_lora_rank:
            self.q_a = lin("q_a_proj", c.q_lora_rank, c.hidden, bias("q_a_proj", c.q_lora_rank))
            self.q_norm = norm("q_a_layernorm", c.q_lora_rank)
            self.q_b = lin("q_b_proj", h * qk, c.q_lora_rank)
        else:
            self.q_a, self.q_b = None, lin("q_proj", h * qk, c.hidden)
        self.kv_a = lin("kv_a_proj_with_mqa", c.row, c.hidden, bias("kv_a_proj_with_mqa", c.row))
        self.kv_norm = norm("kv_a_layernorm", c.kv_lora_rank)
        kv_b = lin("kv_b_proj", h * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank).dequantized()
        kv_b = kv_b.to(dtype).to(device).view(h, c.qk_nope_head_dim + c.v_head_dim, c.kv_lora_rank)
        self.w_kb = kv_b[:, :c.qk_nope_head_dim].contiguous()          # [H, nope, C]
        self.w_vb = kv_b[:, c.qk_nope_head_dim:].contiguous()          # [H, v, C]
        self.o = lin("o_proj", c.hidden, h * c.v_head_dim, bias("o_proj", c.hidden))

    # --- projections ------------------------------------------------------------------
    def _rope(self, x: torch.Tensor, cos, sin) -> torch.Tensor:
        if self.c.rope_interleave:      # (x0, x1), (x2, x3) pairs -> halves, then plain rotate-half
            x = torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)
        return self.rotary.apply(x, cos, sin)

    def queries(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(q_nope [N, H, nope], rotated q_rope [N, H, rope], normalised q latent or None)."""
        n, c = x.shape[0], self.c
        ql = self.q_norm(self.q_a(x)) if self.q_a is not None else None
        q = self.q_b(ql if ql is not None else x).view(n, c.heads, -1)
        return q[..., :c.qk_nope_head_dim], self._rope(q[..., c.qk_nope_head_dim:], cos, sin), ql

    def latent_rows(self, x: torch.Tensor, cos, sin) -> torch.Tensor:
        """Cache rows [N, 1, kv_lora_rank + rope] of the new tokens."""
        kv = self.kv_a(x)
        lat = self.kv_norm(kv[:, :self.c.kv_lora_rank])
        k_rope = self._rope(kv[:, None, self.c.kv_lora_rank:], cos, sin)
        return torch.cat([lat, k_rope[:, 0]], dim=-1)[:, None]

    # --- attention ----------------------------------------------------------------------
    indexer = None          # DSA: an `Indexer` whose keys end each cache row (layers/attention/dsa.py)

    def __call__(self, x: torch.Tensor, cos, sin, cache: KVCache, meta: AttentionMetadata):
        q_nope, q_rope, ql = self.queries(x, cos, sin)
        row = self.latent_rows(x, cos, sin)
        if self.indexer is not None:
            row = torch.cat([row, self.indexer.keys(x, cos, sin)[:, None].to(row.dtype)], dim=-1)
        cache.write(meta.slot_mapping, row)
        chosen = None if self.indexer is None else self.indexer.select(x, ql, cos, sin, cache.k, self.c.row, meta)
        if meta.use_paged(q_nope):     # every step absorbed, over the cache rows in place
            o = self.absorbed(q_nope, q_rope, cache, meta, chosen)
        elif meta.query_index.shape[1] == 1:
            o = self.absorbed(q_nope, q_rope, cache, meta, chosen)
        elif chosen is None and meta.verify_kernel(q_nope, cache.k.dtype, None):
            o = self.absorbed_rows(q_nope, q_rope, cache, meta)
        else:
            o = self.expanded(q_nope, q_rope, cache, meta, chosen)
        return self.o(o.reshape(x.shape[0], -1))

    def expanded(self, q_nope, q_rope, cache: KVCache, meta: AttentionMetadata, chosen=None) -> torch.Tensor:
        """Per-head keys and values from each sequence's cached latents -> [N, H, v]."""
        c = self.c
        rows = gather_rows(cache.k, meta)[:, :, 0, :c.row].to(q_nope.dtype)     # [B, K, row]
        lat, k_rope = rows[..., :c.kv_lora_rank], rows[..., c.kv_lora_rank:]
        kv = torch.einsum("bkc,hdc->bhkd", lat, torch.cat([self.w_kb, self.w_vb], dim=1))
        keys = torch.cat([kv[..., :c.qk_nope_head_dim],
                          k_rope[:, None].expand(-1, c.heads, -1, -1)], dim=-1)   # [B, H, K, nope + rope]
        values = kv[..., c.qk_nope_head_dim:]
        queries = gather_queries(torch.cat([q_nope, q_rope], dim=-1), meta)
        if chosen is None:
            out = masked_sdpa(queries, keys, values, meta, c.scale)
        else:
            out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=chosen.mask, scale=c.scale)
        return scatter(out, meta)

    def absorbed_rows(self, q_nope, q_rope, cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        """A verify's few queries per sequence, each as a decode step at its position computes it
        (`absorbed` with the C kernel): the same bits, so drafts never change greedy output. The
        einsums go one row at a time (`row_einsum`)."""
        c = self.c
        q = torch.cat([row_einsum("nhd,hdc->nhc", q_nope, self.w_kb), q_rope], dim=-1)
        extra = cache.k.shape[-1] - c.row
        qk = F.pad(q, (0, extra)) if extra else q
        rows, slots, lens = verify_rows(meta)
        o = attend_rows(meta.kernel_pool, qk.index_select(0, rows), cache.k, cache.k, slots, lens, c.scale)
        o = in_flat_order(o[..., :c.kv_lora_rank], rows)
        return row_einsum("nhc,hvc->nhv", o, self.w_vb)

    def absorbed(self, q_nope, q_rope, cache: KVCache, meta: AttentionMetadata, chosen=None) -> torch.Tensor:
        """One query per sequence against the latent rows as one shared head -> [N, H, v]."""
        c = self.c
        q = torch.cat([row_einsum("nhd,hdc->nhc", q_nope, self.w_kb), q_rope], dim=-1)   # [N, H, row]
        o = None
        if meta.use_paged(q):          # latent rows are keys ([.., :row]) and values ([.., :rank]) in place
            o = in_place(gather_queries(q, meta), cache.k[..., :c.row], cache.k[..., :c.kv_lora_rank], meta,
                         c.scale, selected=None if chosen is None else chosen.mask)
            if o is not None:
                return torch.einsum("nhc,hvc->nhv", scatter(o, meta), self.w_vb)
        if meta.decode_kernel(q, cache.k.dtype, None):
            # the C kernel reads whole cache rows in place: zero query entries past the latent and
            # rope key leave the scores alone, and the values are the same rows (the latent part is kept)
            extra = cache.k.shape[-1] - c.row
            qk = F.pad(q, (0, extra)) if extra else q
            slots, lens = meta.key_slots, meta.context_lens
            if chosen is not None:     # sparse: only the indexer's top-k rows are read
                slots = slots.gather(1, chosen.top[:, 0]).contiguous()
                lens = lens.clamp(max=chosen.top.shape[-1]) if chosen.count is None \
                    else chosen.count[:, 0].to(lens.dtype).contiguous()
            o = attend_rows(meta.kernel_pool, qk, cache.k, cache.k, slots, lens, c.scale)[..., :c.kv_lora_rank]
        else:
            rows = gather_rows(cache.k, meta).transpose(1, 2)[..., :c.row].to(q.dtype)   # [B, 1, K, row]
            queries = gather_queries(q, meta)
            if chosen is None:
                o = masked_sdpa(queries, rows, rows[..., :c.kv_lora_rank], meta, c.scale)
            else:
                o = F.scaled_dot_product_attention(queries, rows, rows[..., :c.kv_lora_rank], attn_mask=chosen.mask,
                                                   scale=c.scale, enable_gqa=True)
            o = scatter(o, meta)
        return row_einsum("nhc,hvc->nhv", o, self.w_vb)
