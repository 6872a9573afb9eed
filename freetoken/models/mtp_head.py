"""A checkpoint's multi-token-prediction ("nextn") layer, DeepSeek-V3 style (also GLM-4.5/4.6
MoE): stored as decoder layer `num_hidden_layers` with five extra tensors. For position p it
reads the main model's last hidden state h_p (before the final norm) and the embedding of the
token at p+1, and predicts the token at p+2:

    x   = eh_proj(cat(enorm(embed(t_{p+1})), hnorm(h_p)))      (embedding half first)
    h'  = decoder_layer(x)                                      (attention over its own KV, MoE)
    out = head(shared_head.norm(h'))                            (`shared_head.head`, or lm_head)

Chained, h' stands in for h at the next position. The embedding table is the main model's
(DeepSeek-V3 and GLM ship a copy under the nextn layer). The layer's routed experts are a
bank of their own, one layer wide (`mtp_pool`), run by the same backends as the main pool."""
from __future__ import annotations

import torch

from ..errors import CheckpointError
from ..experts.base import ExpertsSeat
from ..layers.norm import RMSNorm
from .context import ForwardContext

# architectures whose nextn layer follows this scheme (the decoder layer built by the class itself)
NEXTN_ARCHITECTURES = ("DeepseekV3ForCausalLM", "Glm4MoeForCausalLM")


def nextn_layers(config: dict) -> int:
    return int(config.get("num_nextn_predict_layers") or 0)


def missing_heads(model, ck) -> str | None:
    """Why this checkpoint's MTP heads cannot draft (one line), or None when they can."""
    arch = type(model).__name__
    n = nextn_layers(model.hf.data)
    if n == 0:
        return f"{ck.dir}: the checkpoint has no multi-token-prediction heads (num_nextn_predict_layers is 0)"
    if arch not in NEXTN_ARCHITECTURES:
        return f"{ck.dir}: {arch} multi-token-prediction heads are not read (built for {', '.join(NEXTN_ARCHITECTURES)})"
    p = f"model.layers.{model.num_layers}"
    for part in ("eh_proj", "enorm", "hnorm", "shared_head.norm"):
        if not ck.has(f"{p}.{part}.weight"):
            return (f"{ck.dir}: no multi-token-prediction heads (num_nextn_predict_layers is {n}, "
                    f"but tensor {p}.{part}.weight is missing)")
    return None


class MTPHead:
    def __init__(self, model, ck):
        i, h = model.num_layers, model.hidden
        p = f"model.layers.{i}"
        self.index, self.model, self.hidden = i, model, h
        norm = lambda name: RMSNorm(ck.get_float(f"{p}.{name}.weight", (h,), model.dtype).to(model.device),  # noqa: E731
                                    model.eps)
        self.enorm, self.hnorm, self.head_norm = norm("enorm"), norm("hnorm"), norm("shared_head.norm")
        self.eh_proj = model.linear.load_rows(ck, [f"{p}.eh_proj.weight"], [(h, 2 * h)], device=model.device)
        head = f"{p}.shared_head.head.weight"
        self.head = (model.linear.load_rows(ck, [head], [(model.vocab_size, h)], device=model.device)
                     if ck.has(head) else model.lm_head)
        self.experts = None
        self.layer = self._with_own_experts(model, lambda: model.decoder_layer(ck, i))
        self.moe = self.experts is not None

    def _with_own_experts(self, model, build):
        """Run `build` with the model seeing the nextn layer as its only MoE layer, seated on an
        experts seat of its own (the main pool and its backend are untouched)."""
        saved = model.moe_layers, model.experts
        moe = model.is_moe_layer(self.index)
        model.moe_layers = [self.index] if moe else []
        model.experts = ExpertsSeat() if moe else None
        try:
            out = build()
            self.experts = model.experts
            return out
        finally:
            model.moe_layers, model.experts = saved

    def build_pool(self, ck):
        """The nextn layer's routed experts as a one-layer pool (the class's own `build_pool`)."""
        model = self.model
        saved = model.moe_layers
        model.moe_layers = [self.index]
        try:
            return model.build_pool(ck)
        finally:
            model.moe_layers = saved

    def attach_experts(self, backend) -> None:
        self.experts.backend = backend
        self.backend = backend

    def forward(self, hidden: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor, cache, meta):
        """h' for rows (h_p, token p+1) at `positions` [n]; writes their KV rows through `meta`."""
        m = self.model
        e = m.embed_tokens(next_ids)
        e = torch.where((positions == 0)[:, None], torch.zeros_like(e), e)   # position 0 has no token before it
        x = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(hidden.to(m.dtype))], dim=-1))
        phase = "decode" if len(next_ids) <= 16 else "prefill"     # a catch-up over a prompt is a prefill
        if self.moe:
            self.backend.begin_step(phase, len(next_ids))
        cos, sin = m.rotary.tables(positions)
        ctx = ForwardContext(attn=meta, kv={self.index: cache}, states=[None], query_lens=[len(next_ids)],
                             phase=phase)
        return self.layer(self.index, x, cos, sin, ctx)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(self.head_norm(h)).float()

    def kv_row(self) -> tuple:
        """(kv heads, head dim[, values]) of its attention's cache rows (the model's last layer's)."""
        rows = type(self.model).kv_rows(self.model.hf)
        if not rows:
            raise CheckpointError("the model keeps no paged KV rows; its nextn layer cannot attend")
        return tuple(rows[-1][1:])
