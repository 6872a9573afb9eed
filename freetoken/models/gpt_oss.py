"""gpt-oss: alternating sliding-window and full attention, both with learned sinks and
q/k/v/o biases; YaRN rope; router with bias, softmax over the top-k logits; experts with
biases and a clamped SwiGLU, shipped as MXFP4 (kept packed in the expert pool).

Full-attention layers keep paged KV. Sliding-window layers keep only the last `window`
keys/values of each sequence in its `SlidingWindowKV` state (a ring buffer), so their
memory is bounded and the state snapshots/restores like a recurrent one. A decoding row's layer
is two C calls as other decoders' (models/decoder.DecoderLayer.row_call): the attention half with
the sinks, a sliding-window layer's keys read from its ring, then the MoE block + residual; and a
decoding row's step takes every layer's two calls and the final norm in one C call as theirs
(layers/attention/decode_stack.py)."""
from __future__ import annotations

import torch

from ..experts.memory.pool import ExpertSpec, PoolBuilder
from ..layers.attention.paged import attend_rows
from ..layers.moe import SparseMoE
from ..layers.norm import RMSNorm, rms_norm
from ..layers.attention.sinks import paged_attention_sinks, window_attention_sinks
from ..layers.state import SequenceState, SlidingWindowKV, check_positions
from .context import ForwardContext
from .decoder import ArchSpec, Attention, DecoderLayer, MoECausalLM, tiny_base, tiny_moe_inter
from ..quant.mxfp4 import quantize_mxfp4


class RMSNormF32:
    """gpt-oss keeps norm weights in float32 and multiplies before casting back."""

    def __init__(self, weight: torch.Tensor, eps: float):
        self.weight, self.eps = weight.float(), eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return rms_norm(x, self.weight, self.eps)     # the same math (one C call on the CPU)
        h = x.float()
        return (self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps))).to(x.dtype)


class SinkAttention(Attention):
    def __init__(self, ck, p, hf, arch, linear, device, rotary, window):
        super().__init__(ck, p, hf, arch, linear, device, rotary, window)
        self.sinks = ck.get_float(f"{p}.sinks", (self.heads,)).to(device)

    def project(self, x, cos, sin):
        n = x.shape[0]
        q, k, v = self.qkv(x).split(self.splits, dim=-1)
        q = self.rotary.apply(q.reshape(n, self.heads, self.head_dim), cos, sin)
        k = self.rotary.apply(k.reshape(n, self.kv_heads, self.head_dim), cos, sin)
        return q, k, v.reshape(n, self.kv_heads, self.head_dim)

    def __call__(self, x, cos, sin, cache, meta):
        q, k, v = self.project(x, cos, sin)
        o = paged_attention_sinks(q, k, v, cache, meta, self.scale, self.sinks, prefill_dtype=self.prefill_dtype)
        return self.o(o.reshape(x.shape[0], -1))

    def windowed(self, x, cos, sin, positions, ctx: ForwardContext, slot: int):
        q, k, v = self.project(x, cos, sin)
        pool = ctx.attn.kernel_pool
        if pool is not None and ctx.attn.query_index.shape[1] == 1 and q.dtype == torch.float32:
            return self.o(self._windowed_decode(pool, q, k, v, ctx, slot).reshape(x.shape[0], -1))
        out = torch.empty_like(q)
        start = 0
        for st, n in zip(ctx.states, ctx.query_lens):
            if n:
                sw, sl = st.parts["window"], slice(start, start + n)
                pk, pv, pp = sw.cached(slot, sw.position)
                out[sl] = window_attention_sinks(q[sl], k[sl], v[sl], positions[sl], pk, pv, pp,
                                                 self.scale, self.sinks, self.window, pool, self.prefill_dtype)
                sw.write(slot, sw.position, k[sl], v[sl])
            start += n
        return self.o(out.reshape(x.shape[0], -1))

    def _windowed_decode(self, pool, q, k, v, ctx: ForwardContext, slot: int):
        """One new token per sequence, on the CPU: write it into the ring, whose last `window`
        rows are then exactly the visible keys, and let the C kernel read them in place."""
        out = torch.empty_like(q)
        sinks = self.sinks.float().contiguous()
        for i, st in enumerate(ctx.states):
            sw = st.parts["window"]
            sw.write(slot, sw.position, k[i:i + 1], v[i:i + 1])
            lo = max(0, sw.position + 1 - sw.window)
            rows = (torch.arange(lo, sw.position + 1) % sw.window)[None]
            out[i] = attend_rows(pool, q[i:i + 1], sw.k[slot], sw.v[slot], rows, torch.tensor([rows.shape[1]]),
                                 self.scale, sinks)[0]
        return out


class GptOssLayer(DecoderLayer):
    half_attention = SinkAttention
    row_stack = True        # DecoderLayer.row_call's two calls, a ring layer's keys from `row_ring`

    def __init__(self, attn: SinkAttention, window_slot: int | None, mlp, input_norm, post_norm):
        super().__init__(attn, mlp, input_norm, post_norm)
        self.slot = window_slot

    def row_ring(self, ctx: ForwardContext) -> tuple | None:
        return None if self.slot is None or len(ctx.states) != 1 else (ctx.states[0].parts["window"], self.slot)

    def row_norms(self) -> tuple:
        # on the fp32 rows the one-call half takes, RMSNormF32 is RMSNorm's math (its fp32 branch)
        return tuple(RMSNorm(n.weight, n.eps) for n in (self.input_norm, self.post_norm))

    def __call__(self, idx, x, cos, sin, ctx: ForwardContext, positions=None):
        if x.shape[0] == 1 and len(ctx.states) == 1:     # one decoding row: its layer in two C calls
            ring = self.row_ring(ctx)
            if (out := self.row_call(x, cos, sin, ctx, ctx.kv[idx] if ring is None else None, ring)) is not None:
                return out
        h = self.input_norm(x)
        if self.slot is None:
            h = self.attn(h, cos, sin, ctx.kv[idx], ctx.attn)
        else:
            h = self.attn.windowed(h, cos, sin, positions, ctx, self.slot)
        h = x + h
        return h + self.mlp(self.post_norm(h))


class GptOssForCausalLM(MoECausalLM):
    arch = ArchSpec(attn_bias_default=True, router_name="router")

    @classmethod
    def tiny_config(cls, layers, experts, top_k, hidden, vocab):
        return "GptOssConfig", dict(
            tiny_base(layers, hidden, vocab), head_dim=hidden // 4, intermediate_size=tiny_moe_inter(hidden),
            num_local_experts=experts, num_experts_per_tok=top_k, sliding_window=8)

    def __init__(self, ck, cfg, max_len: int):
        super().__init__(ck, cfg, max_len)
        self.norm = RMSNormF32(self.norm.weight, self.eps)
        self.row_norm = RMSNorm(self.norm.weight, self.eps)    # its math on the fp32 row the one-call step takes

    @property
    def window_layers(self) -> list[int]:
        return [i for i in range(self.num_layers) if self.sliding_window(i)]

    @staticmethod
    def _windowed(hf) -> list[bool]:
        types = hf.get("layer_types") or []
        return [t == "sliding_attention" and bool(hf.get("sliding_window")) for t in types] or \
            [False] * hf.req("num_hidden_layers")

    @classmethod
    def kv_rows(cls, hf):
        windowed = cls._windowed(hf)
        return [row for row in super().kv_rows(hf) if not windowed[row[0]]]

    @classmethod
    def expert_extra_bytes(cls, hf):
        """The gate_up and down biases `build_pool` adds, fp32."""
        return (2 * hf.first("moe_intermediate_size", "intermediate_size") + hf.req("hidden_size")) * 4

    @classmethod
    def new_state(cls, hf, max_len, kv_dtype, act_dtype, device) -> SequenceState:
        n = sum(cls._windowed(hf))
        if not n:
            return SequenceState()
        _, kv_heads, head_dim = super().kv_rows(hf)[0]
        return SequenceState({"window": SlidingWindowKV(n, hf.get("sliding_window"), kv_heads, head_dim,
                                                        act_dtype, device)})

    def expert_intermediate(self) -> int:
        return self.hf.req("intermediate_size")

    def build_pool(self, ck):
        """Fused [E, H, 2I] float experts (gate/up interleaved on the last dim) or MXFP4
        `*_blocks`/`*_scales` [E, out, in/32, (16)]; both become gate-rows-then-up-rows banks.
        MXFP4 rows are only permuted, never dequantized."""
        e, inter, h = self.num_experts(), self.expert_intermediate(), self.hidden
        p0 = f"model.layers.{self.moe_layers[0]}.mlp.experts"
        fmt = "mxfp4" if ck.has(f"{p0}.gate_up_proj_blocks") else "float"
        spec = ExpertSpec(hidden=h, intermediate=inter, fmt=fmt, activation="swiglu_oai",
                          alpha=float(self.hf.get("swiglu_alpha", 1.702)),
                          limit=float(self.hf.get("swiglu_limit", 7.0)))
        b = PoolBuilder(len(self.moe_layers), e, spec)
        deinterleave = lambda t: torch.cat([t[:, 0::2], t[:, 1::2]], dim=1)  # noqa: E731
        for m, i in enumerate(self.moe_layers):
            p = f"model.layers.{i}.mlp.experts"
            if fmt == "mxfp4":
                for name, out, inn in (("gate_up", 2 * inter, h), ("down", h, inter)):
                    blocks = ck.get(f"{p}.{name}_proj_blocks", (e, out, inn // 32, 16))
                    scales = ck.get(f"{p}.{name}_proj_scales", (e, out, inn // 32))
                    if name == "gate_up":
                        blocks, scales = deinterleave(blocks), deinterleave(scales)
                    b.put_layer(f"{name}_blocks", m, blocks, torch.uint8)
                    b.put_layer(f"{name}_scales", m, scales, torch.uint8)
            else:
                dt = self.expert_dtype
                gu = ck.get_float(f"{p}.gate_up_proj", (e, h, 2 * inter), dt).transpose(1, 2)
                b.put_layer("gate_up", m, deinterleave(gu), dt)
                b.put_layer("down", m, ck.get_float(f"{p}.down_proj", (e, inter, h), dt).transpose(1, 2), dt)
            b.put_layer("gate_up_bias", m, deinterleave(ck.get_float(f"{p}.gate_up_proj_bias", (e, 2 * inter))),
                        torch.float32)
            b.put_layer("down_bias", m, ck.get_float(f"{p}.down_proj_bias", (e, h)), torch.float32)
        return b.build()

    def _load_moe(self, ck, i: int):
        p = f"model.layers.{i}.mlp.router"
        e = self.num_experts()
        router = self.linear(self._ws(ck, f"{p}.weight", (e, self.hidden)), self._w(ck, f"{p}.bias", (e,)), fmt=None)
        return SparseMoE(self.moe_layers.index(i), router, self.experts, self.top_k(), False, softmax_after_topk=True)

    def _load_layer(self, ck, i: int):
        p = f"model.layers.{i}"
        window = self.sliding_window(i)
        attn = SinkAttention(ck, f"{p}.self_attn", self.hf, self.arch, self.linear, self.device, self.rotary, window)
        slot = self.window_layers.index(i) if window else None
        norms = [RMSNormF32(ck.get_float(f"{p}.{n}.weight", (self.hidden,)).to(self.device), self.eps)
                 for n in ("input_layernorm", "post_attention_layernorm")]
        return GptOssLayer(attn, slot, self._load_moe(ck, i), *norms)

    def forward(self, input_ids, positions, ctx: ForwardContext):
        check_positions(ctx.states, ctx.query_lens, positions)
        self.experts.begin_step(ctx.phase, len(input_ids))
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary.tables(positions)
        if (out := self._stack_row(x, cos, sin, ctx, self.row_norm)) is not None:
            x, normed = out
        else:
            for i, layer in enumerate(self.layers):
                x = layer(i, x, cos, sin, ctx, positions)
            normed = None
        for st, n in zip(ctx.states, ctx.query_lens):
            st.advance(n)
        self.prenorm = x            # the last hidden states before the final norm
        return normed if normed is not None else self.norm(x)


def quantize_checkpoint_experts(model_dir) -> None:
    """Rewrite a float gpt-oss checkpoint's experts as MXFP4 `*_blocks`/`*_scales`, the layout
    OpenAI ships (used by make-tiny; transformers reads it back by dequantizing)."""
    import json
    from pathlib import Path

    from safetensors.torch import load_file, save_file


    d = Path(model_dir)
    files = sorted(d.glob("*.safetensors"))
    for f in files:
        out = {}
        for name, t in load_file(str(f)).items():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                out[name + "_blocks"], out[name + "_scales"] = quantize_mxfp4(t.transpose(1, 2).contiguous())
            else:
                out[name] = t
        save_file(out, str(f), metadata={"format": "pt"})
    index = d / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        wm = {}
        for name, shard in data["weight_map"].items():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                wm[name + "_blocks"] = wm[name + "_scales"] = shard
            else:
                wm[name] = shard
        data["weight_map"] = wm
        index.write_text(json.dumps(data, indent=2))
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
