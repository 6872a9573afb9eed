"""DeepSeek-V4 attention: one shared key/value head (K = V) over the last `sliding_window`
tokens plus, per `layer_types`, the compressed entries of a CSA or HCA compressor
(`layers/attention/compressor.py`); learned per-head sinks; rope on the trailing `qk_rope_head_dim`
features (interleaved pairs), undone on the output with the negated angle; grouped low-rank
output projection (`o_groups` blocks of heads, each to `o_lora_rank`, then one mix).

The window is a per-sequence ring (`SlidingWindowKV`, keys only), the compressors' state
per-sequence `CompressorState`s: nothing of a V4 model lives in the paged KV."""
from __future__ import annotations

import torch

from .compressor import Compressor, V4Indexer, rope_tail, visible
from ..hyper import unweighted_rms_norm
from ..ggml_linear import GgmlLinear, GgmlWeight
from ..linear import Linear
from ..norm import RMSNorm


def split_rows(w: Linear | GgmlLinear, groups: int, linear) -> list[Linear | GgmlLinear]:
    """One Linear per equal block of rows; GGUF rows and FP8 blocks stay packed (FP8 when the
    rows of a group fill whole 128-row scale blocks), otherwise the weight is dequantized once."""
    rows = w.out_features // groups
    if isinstance(w, GgmlLinear) and len(w.parts) == 1:
        p = w.parts[0]
        return [GgmlLinear([GgmlWeight(p.rows[g * rows:(g + 1) * rows], p.type, p.cols)], None, w.pool, w.gemm_dtype)
                for g in range(groups)]
    if w.weight.dtype == torch.float8_e4m3fn and w.scales is not None and rows % 128 == 0:
        sr = rows // 128
        return [linear(w.weight[g * rows:(g + 1) * rows], scale_inv=w.scales[g * sr:(g + 1) * sr])
                for g in range(groups)]
    full = w.dequantized().to(linear.storage_dtype) if w.weight.dtype == torch.float8_e4m3fn or w.scales is not None \
        else w.weight
    return [linear(full[g * rows:(g + 1) * rows]) for g in range(groups)]


class V4Attention:
    def __init__(self, get, lin, linear, p: str, c: dict, layer_type: str, device):
        """`get(name, shape, dtype=float32)` reads a tensor, `lin(name, shape)` a dense Linear
        (float or FP8 as shipped); `c` the config fields."""
        h, d, hidden, q_lora = c["num_attention_heads"], c["head_dim"], c["hidden_size"], c["q_lora_rank"]
        self.heads, self.dim, self.window, self.eps = h, d, c["sliding_window"], c["rms_norm_eps"]
        self.groups, rank = c["o_groups"], c["o_lora_rank"]
        self.wq_a = lin(f"{p}.wq_a.weight", (q_lora, hidden))
        self.q_norm = RMSNorm(get(f"{p}.q_norm.weight", (q_lora,)), self.eps)
        self.wq_b = lin(f"{p}.wq_b.weight", (h * d, q_lora))
        self.wkv = lin(f"{p}.wkv.weight", (d, hidden))
        self.kv_norm = RMSNorm(get(f"{p}.norm.weight", (d,)), self.eps)
        wo_a = lin(f"{p}.wo_a.weight", (self.groups * rank, h * d // self.groups))
        self.wo_a = split_rows(wo_a, self.groups, linear)          # block-diagonal: one Linear per group
        self.wo_b = lin(f"{p}.wo_b.weight", (hidden, self.groups * rank))
        self.sinks = get(f"{p}.attn_sink", (h,))
        self.scale = d ** -0.5
        self.compressor = self.indexer = None
        if layer_type in ("compressed_sparse_attention", "heavily_compressed_attention"):
            rate = c["compress_rates"][layer_type]
            csa = layer_type == "compressed_sparse_attention"
            self.compressor = Compressor(get, f"{p}.compressor", hidden, d, rate, csa, self.eps, linear.pool)
            if csa:
                self.indexer = V4Indexer(get, lin, linear, f"{p}.indexer", hidden, q_lora, c["index_n_heads"],
                                         c["index_head_dim"], rate, c["index_topk"], self.eps, device)
        elif layer_type != "sliding_attention":
            raise ValueError(f"layer type {layer_type!r} is not a DeepSeek-V4 attention type")

    def __call__(self, x, cos, sin, positions, ctx, slot: int, tables) -> torch.Tensor:
        """x [N, hidden] (normalised), cos/sin [N, pairs] of this layer's rope; `slot` indexes
        this layer in the window state; `tables` the full compress-rope tables for entries."""
        n = x.shape[0]
        ql = self.q_norm(self.wq_a(x))
        q = rope_tail(unweighted_rms_norm(self.wq_b(ql).view(n, self.heads, self.dim), self.eps), cos, sin)
        kv = rope_tail(self.kv_norm(self.wkv(x)), cos, sin)
        out = torch.empty(n, self.heads, self.dim, dtype=torch.float32, device=x.device)
        start = 0
        for st, m in zip(ctx.states, ctx.query_lens):
            if m:
                sl = slice(start, start + m)
                out[sl] = self._sequence(st, slot, q[sl], kv[sl], x[sl], ql[sl], positions[sl], cos[sl], sin[sl], tables)
            start += m
        o = rope_tail(out, cos, -sin).to(x.dtype).view(n, self.groups, -1)
        grouped = torch.cat([w(o[:, g]) for g, w in enumerate(self.wo_a)], dim=-1)
        return self.wo_b(grouped)

    def _sequence(self, st, slot, q, kv, x, ql, pos, cos, sin, tables) -> torch.Tensor:
        win = st.parts["window"]
        start = win.position
        prev, _, prev_pos = win.cached(slot, start)
        keys = torch.cat([prev[:, 0].to(kv.dtype), kv])
        kpos = torch.cat([prev_pos.to(pos.device), pos])
        mask = (kpos[None] <= pos[:, None]) & (kpos[None] > pos[:, None] - self.window)
        win.write(slot, start, kv[:, None], None)
        if self.compressor is not None:
            cst = st.parts[f"compress{slot}"]
            entries = self.compressor.step(cst, x, *tables)
            if self.indexer is not None:
                chosen = self.indexer.select(st.parts[f"index{slot}"], x, ql, pos, cos, sin, *tables)
            else:
                chosen = visible(pos, entries.shape[0], self.compressor.rate)
            keys = torch.cat([keys, entries.to(keys.dtype)])
            mask = torch.cat([mask, chosen], dim=1)
        keys = keys.float()
        logits = torch.einsum("nhd,kd->hnk", q.float(), keys) * self.scale
        logits = logits.masked_fill(~mask, float("-inf"))
        sinks = self.sinks.float()[:, None, None].expand(-1, q.shape[0], 1)
        probs = torch.softmax(torch.cat([logits, sinks], dim=-1), dim=-1)[..., :-1]
        return torch.einsum("hnk,kd->nhd", probs, keys)
