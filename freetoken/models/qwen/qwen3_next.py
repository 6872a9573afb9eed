"""Qwen3-Next: gated-DeltaNet linear attention interleaved (3:1) with gated full attention,
zero-centred (1 + w) RMSNorms, many small experts plus a sigmoid-gated shared expert.

Only the full-attention layers keep paged KV; each sequence carries a `SequenceState`
with the DeltaNet conv and recurrent state of every linear layer. Multi-token-prediction
weights (`mtp.*`) are never read."""
from __future__ import annotations

import torch

from ...errors import CheckpointError
from ...layers.deltanet import GatedDeltaNet
from ...layers.attention.gated import GatedAttention, RMSNorm1p
from ...layers.state import DeltaNetState, SequenceState, check_positions
from ..context import ForwardContext
from ..decoder import ArchSpec, DecoderLayer, MoECausalLM, tiny_base, tiny_moe_inter


class LinearAttentionLayer:
    """Decoder layer whose token mixer is gated DeltaNet over per-sequence states."""

    def __init__(self, slot: int, mixer: GatedDeltaNet, mlp, input_norm, post_norm):
        self.slot, self.mixer, self.mlp, self.input_norm, self.post_norm = slot, mixer, mlp, input_norm, post_norm

    def __call__(self, idx, x, cos, sin, ctx: ForwardContext):
        h = x + self.mix(self.input_norm(x), ctx)
        return h + self.mlp(self.post_norm(h))

    def mix(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        j = self.slot
        states = [s.parts["deltanet"] for s in ctx.states]
        starts = [0]
        for n in ctx.query_lens:
            starts.append(starts[-1] + n)
        out = torch.empty_like(x)
        single = [b for b, n in enumerate(ctx.query_lens) if n == 1]
        if len(single) > 1:          # decode tokens of many sequences: one batched recurrent step
            rows = torch.tensor([starts[b] for b in single], device=x.device)
            conv = torch.stack([states[b].conv[j] for b in single])
            rec = torch.stack([states[b].rec[j] for b in single])
            o, conv, rec = self.mixer(x[rows].unsqueeze(1), conv, rec)
            out[rows] = o[:, 0]
            for i, b in enumerate(single):
                states[b].conv[j].copy_(conv[i])
                states[b].rec[j].copy_(rec[i])
        for b, n in enumerate(ctx.query_lens):
            if n == 0 or (n == 1 and len(single) > 1):
                continue
            st = states[b]
            o, conv, rec = self.mixer(x[starts[b]:starts[b + 1]].unsqueeze(0), st.conv[j][None], st.rec[j][None])
            out[starts[b]:starts[b + 1]] = o[0]
            st.conv[j].copy_(conv[0])
            st.rec[j].copy_(rec[0])
        return out


class Qwen3NextForCausalLM(MoECausalLM):
    arch = ArchSpec(shared_expert=True, norm_topk_default=True)

    @classmethod
    def tiny_config(cls, layers, experts, top_k, hidden, vocab):
        return "Qwen3NextConfig", dict(
            tiny_base(layers, hidden, vocab), head_dim=hidden // 4, intermediate_size=2 * hidden,
            moe_intermediate_size=tiny_moe_inter(hidden), shared_expert_intermediate_size=hidden,
            num_experts=experts, num_experts_per_tok=top_k, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=hidden // 4, linear_value_head_dim=hidden // 4,
            layer_types=["full_attention" if i % 2 else "linear_attention" for i in range(layers)])

    def __init__(self, ck, cfg, max_len: int):
        types = self.layer_schedule(ck.config)
        self.layer_types = list(types)
        self.linear_layers = [i for i, t in enumerate(types) if t == "linear_attention"]
        super().__init__(ck, cfg, max_len)
        self.norm = RMSNorm1p(self.norm.weight, self.eps)

    @staticmethod
    def layer_schedule(config: dict) -> list[str]:
        """`layer_types`, or the schedule Qwen3-Next's config class derives (every
        `full_attention_interval`-th layer full attention, the others gated DeltaNet)."""
        return config.get("layer_types") or [
            "full_attention" if (i + 1) % config.get("full_attention_interval", 4) == 0 else "linear_attention"
            for i in range(config["num_hidden_layers"])]

    @classmethod
    def kv_rows(cls, hf):
        full = {i for i, t in enumerate(cls.layer_schedule(hf.data)) if t == "full_attention"}
        return [row for row in super().kv_rows(hf) if row[0] in full]

    @classmethod
    def new_state(cls, hf, max_len, kv_dtype, act_dtype, device) -> SequenceState:
        linear = cls.layer_schedule(hf.data).count("linear_attention")
        if not linear:
            return SequenceState()
        conv, rec = GatedDeltaNet.state_shapes(hf.data)
        return SequenceState({"deltanet": DeltaNetState(linear, conv, rec, act_dtype, device)})

    def _load_layer(self, ck, i: int):
        p = f"model.layers.{i}"
        mlp = self._load_moe(ck, i) if i in self.moe_layers else self._load_mlp(ck, i)
        norms = [RMSNorm1p(self._w(ck, f"{p}.{n}.weight", (self.hidden,)), self.eps)
                 for n in ("input_layernorm", "post_attention_layernorm")]
        if self.layer_types[i] == "linear_attention":
            get = lambda n: ck.get(f"{p}.linear_attn.{n}")  # noqa: E731
            mixer = GatedDeltaNet.load(get, self.hf.data, self.linear, self.device)
            return LinearAttentionLayer(self.linear_layers.index(i), mixer, mlp, *norms)
        if self.layer_types[i] != "full_attention":
            raise CheckpointError(f"{ck.dir}/config.json: layer_types[{i}] is {self.layer_types[i]!r}, "
                                  "expected 'linear_attention' or 'full_attention'")
        get = lambda n, s, dt=None: ck.get_float(f"{p}.self_attn.{n}", s, dt or self.dtype).to(self.device)  # noqa: E731
        heads = self.hf.req("num_attention_heads")
        attn = GatedAttention(get, self.linear, heads, self.kv_heads, self.head_dim, self.hidden, self.eps, self.rotary,
                              bool(self.hf.get("attention_bias", False)))
        return DecoderLayer(attn, mlp, *norms)

    def forward(self, input_ids, positions, ctx: ForwardContext):
        check_positions(ctx.states, ctx.query_lens, positions)
        hidden = super().forward(input_ids, positions, ctx)
        for st, n in zip(ctx.states, ctx.query_lens):
            st.advance(n)
        return hidden
