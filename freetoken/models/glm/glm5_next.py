"""GLM-5.3-Flash (`Glm5NextForConditionalGeneration`, its text part): KDA linear attention
(`layers/kda.py`) in most layers, NoPE multi-head latent attention with GLM's pooled DSA
indexer (`layers/attention/mla.py`, `layers/attention/dsa_pooled.py`) in the others ("indexed_attention"),
hyper-connections carrying `hc_mult` residual streams (`layers/hyper.py`, collapsed at the
end by a plain mean), DeepSeek's sigmoid router with shared experts, and a clamped SwiGLU
(`swiglu_limit`) in experts, shared experts and dense layers.

The config lives under `text_config` and the weights under `model.language_model.*`
(a flat text-only checkpoint with both at the top level is read too); `model.visual.*` and
multi-token-prediction layers are never read. Only the MLA layers keep paged KV; each
sequence carries the KDA conv and recurrent states (the gated DeltaNet's shapes and state
object, so prefix-cache checkpoints work as for Qwen3.5)."""
from __future__ import annotations

from dataclasses import replace

import torch

from ...errors import CheckpointError
from ...experts.memory.pool import ExpertPool
from ...layers.attention.dsa import SharedSelection
from ...layers.attention.dsa_pooled import PooledIndexer
from ...layers.hyper import HyperConnection
from ...layers.kda import KimiDeltaAttention
from ...layers.linear import LinearFactory
from ...layers.attention.mla import MLA, MLAConfig
from ...layers.norm import RMSNorm
from ...layers.state import DeltaNetState, SequenceState, check_positions
from ..context import ForwardContext
from ..decoder import model_basics, tiny_base, tiny_moe_inter
from ..deepseek.deepseek_v3 import DeepseekV3ForCausalLM, latent_row
from .glm_moe_dsa import indexer_types
from ..hf_config import HFConfig
from ..qwen.qwen3_5_moe import LanguageModelView, text_part
from ..qwen.qwen3_next import LinearAttentionLayer


class NoRope:
    """The rotary stand-in for NoPE attention: positions only enter through causality."""

    @staticmethod
    def apply(x, cos, sin):
        return x


def layer_schedule(hf: HFConfig) -> tuple[list[str], list[str]]:
    """(layer_types, mlp_layer_types) with the defaults GLM's config class derives."""
    n = hf.req("num_hidden_layers")
    types = hf.get("layer_types") or ["indexed_attention" if i % 4 == 3 else "linear_attention" for i in range(n)]
    types = ["indexed_attention" if t == "full_attention" else t for t in types]
    mlp = hf.get("mlp_layer_types") or ["dense"] * min(3, n) + ["sparse"] * (n - 3)
    for name, got, allowed in (("layer_types", types, ("linear_attention", "indexed_attention")),
                               ("mlp_layer_types", mlp, ("dense", "sparse"))):
        if len(got) < n or any(t not in allowed for t in got[:n]):
            raise CheckpointError(f"{hf.path}: field {name!r} is {got!r}, expected {n} entries of {allowed}")
    return list(types[:n]), list(mlp[:n])


class Glm5NextLayer:
    def __init__(self, i, mixer, mlp, input_norm, post_norm, attn_hc, ffn_hc):
        self.i, self.mixer, self.mlp, self.input_norm, self.post_norm = i, mixer, mlp, input_norm, post_norm
        self.attn_hc, self.ffn_hc = attn_hc, ffn_hc

    def __call__(self, streams: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        post, comb, h = self.attn_hc(streams)
        h = self.input_norm(h)
        if isinstance(self.mixer, LinearAttentionLayer):
            a = self.mixer.mix(h, ctx)
        else:
            a = self.mixer(h, None, None, ctx.kv[self.i], ctx.attn)
        streams = HyperConnection.expand(post, comb, a, streams)
        post, comb, h = self.ffn_hc(streams)
        return HyperConnection.expand(post, comb, self.mlp(self.post_norm(h)), streams)


class Glm5NextForConditionalGeneration(DeepseekV3ForCausalLM):
    tiny_model = "Glm5NextForConditionalGeneration"   # AutoModelForCausalLM would build the text model only

    @classmethod
    def tiny_config(cls, layers, experts, top_k, hidden, vocab):
        return "Glm5NextConfig", dict(text_config=dict(
            tiny_base(layers, hidden, vocab, kv_heads=4), intermediate_size=2 * hidden,
            moe_intermediate_size=tiny_moe_inter(hidden), n_routed_experts=experts, num_experts_per_tok=top_k,
            n_shared_experts=1, kv_lora_rank=hidden // 2, q_lora_rank=hidden // 2, qk_nope_head_dim=hidden // 4,
            qk_rope_head_dim=0, v_head_dim=hidden // 4, index_topk=8, index_head_dim=hidden // 4, index_n_heads=8,
            index_kpool=4, linear_num_heads=4, linear_head_dim=hidden // 4, hc_mult=2,
            layer_types=["indexed_attention" if i % 2 else "linear_attention" for i in range(layers)],
            mlp_layer_types=["dense" if i == 0 else "sparse" for i in range(layers)]),
            vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=hidden,
                               patch_size=2, temporal_patch_size=1, spatial_merge_size=1,
                               projection_intermediate_size=32))

    def __init__(self, ck, cfg, max_len: int):  # noqa: C901 - one pass over the checkpoint
        if isinstance(ck.config.get("text_config"), dict) or ck.has("model.language_model.embed_tokens.weight"):
            ck = LanguageModelView(ck)
        hf, pool = model_basics(self, ck, cfg, max_len, eps_default=1e-5)
        self.layer_types, self.mlp_types = layer_schedule(hf)
        self.indexer_types = indexer_types(hf.data, hf.path)
        for i, t in enumerate(self.layer_types):   # a shared layer reuses the selection of the layer just before
            if t == "indexed_attention" and self.indexer_types[i] == "shared" and not (
                    i > 0 and self.layer_types[i - 1] == "indexed_attention" and self.indexer_types[i - 1] == "full"):
                raise CheckpointError(f"{hf.path}: layer {i} is a 'shared' indexed layer, but layer {i - 1} is not "
                                      "a 'full' indexed layer (field 'indexer_types')")
        if hf.get("qk_rope_head_dim", 0):
            raise CheckpointError(f"{hf.path}: field 'qk_rope_head_dim' is {hf.get('qk_rope_head_dim')}, "
                                  "expected 0 (GLM-5.3-Flash attention is NoPE)")
        self.hc, self.limit = hf.first("hc_mult", default=4), hf.first("swiglu_limit", default=10.0, kind=float)
        nope = hf.req("qk_nope_head_dim")
        self.mla = MLAConfig(hidden=self.hidden, heads=hf.req("num_attention_heads"), q_lora_rank=hf.req("q_lora_rank"),
                             kv_lora_rank=hf.req("kv_lora_rank"), qk_nope_head_dim=nope, qk_rope_head_dim=0,
                             v_head_dim=hf.req("v_head_dim"), rope_interleave=False,
                             bias=bool(hf.get("attention_bias", False)), scale=nope ** -0.5)
        self.rotary = NoRope()
        self.linear = LinearFactory(self.dtype, cfg.torch_dtype, cfg.dense_format, pool, self.choices.prefill_gemm)
        self._load_ends(ck)
        self.linear_layers = [i for i, t in enumerate(self.layer_types) if t == "linear_attention"]
        self.moe_layers = [i for i, t in enumerate(self.mlp_types) if t == "sparse"] if self.num_experts() else []
        self.experts = self._load_experts(ck) if self.moe_layers else None
        self._full_indexer = None
        self.layers = [self._load_layer(ck, i) for i in range(self.num_layers)]

    # --- hooks the engine reads -----------------------------------------------------------
    @classmethod
    def text_config(cls, config: dict) -> dict:
        return text_part(config)

    @classmethod
    def kv_rows(cls, hf):
        """MLA layers: one latent row per token, plus [indexer key | pool gate] on "full" ones."""
        extra, types = 2 * hf.req("index_head_dim"), indexer_types(hf.data, hf.path)
        return [(i, 1, latent_row(hf) + (extra if types[i] == "full" else 0), False)
                for i, t in enumerate(layer_schedule(hf)[0]) if t == "indexed_attention"]

    @classmethod
    def gathered_values(cls, hf):
        """MLA's latent row, and the [indexer key | pool gate] the pooled indexer gathers in fp32
        (dsa_pooled.py)."""
        return latent_row(hf), 2 * hf.req("index_head_dim")

    @classmethod
    def new_state(cls, hf, max_len, kv_dtype, act_dtype, device) -> SequenceState:
        linear = layer_schedule(hf)[0].count("linear_attention")
        if not linear:
            return SequenceState()
        conv, rec = KimiDeltaAttention.state_shapes(hf.data)
        return SequenceState({"deltanet": DeltaNetState(linear, conv, rec, act_dtype, device)})

    # --- loading ---------------------------------------------------------------------------
    def build_pool(self, ck) -> ExpertPool:
        """DeepSeek's expert layouts (float, fused, FP8, NVFP4), computing the clamped SwiGLU."""
        pool = super().build_pool(ck)
        pool.spec = replace(pool.spec, activation="silu_clamp", limit=self.limit)
        return pool

    def _gated_mlp(self, ck, p: str, inter: int):
        mlp = super()._gated_mlp(ck, p, inter)
        mlp.limit = self.limit
        return mlp

    def _hyper(self, ck, p: str, kind: str) -> HyperConnection:
        hc, n = self.hc, (2 + self.hc) * self.hc
        get = lambda name, shape: ck.get_float(f"{p}.hc_{kind}_{name}", shape).to(self.device)  # noqa: E731
        return HyperConnection(get("fn", (n, hc * self.hidden)), get("base", (n,)), get("scale", (3,)), hc,
                               self.hf.first("hc_sinkhorn_iters", default=20),
                               self.hf.first("hc_eps", default=1e-6, kind=float), self.eps)

    def _load_layer(self, ck, i: int) -> Glm5NextLayer:
        p = f"model.layers.{i}"
        if self.layer_types[i] == "linear_attention":
            kda = KimiDeltaAttention.load(lambda n: ck.get(f"{p}.self_attn.{n}"), self.hf.data, self.linear,
                                          self.device)
            mixer = LinearAttentionLayer(self.linear_layers.index(i), kda, None, None, None)
        else:
            mixer = MLA(ck, f"{p}.self_attn", self.mla, self.linear, self.rotary, self.dtype, self.device,
                        latent_eps=self.eps)
            if self.indexer_types[i] == "full":
                mixer.indexer = self._full_indexer = PooledIndexer(ck, f"{p}.self_attn.indexer", self.hf, self.linear,
                                                                   self.dtype, self.device)
            else:
                mixer.indexer = SharedSelection(self._full_indexer)
        mlp = self._load_moe(ck, i) if i in self.moe_layers else self._load_mlp(ck, i)
        norms = [RMSNorm(self._w(ck, f"{p}.{n}.weight", (self.hidden,)), self.eps)
                 for n in ("input_layernorm", "post_attention_layernorm")]
        return Glm5NextLayer(i, mixer, mlp, *norms, self._hyper(ck, p, "attn"), self._hyper(ck, p, "ffn"))

    # --- compute ---------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        check_positions(ctx.states, ctx.query_lens, positions)
        if self.experts is not None:
            self.experts.begin_step(ctx.phase, len(input_ids))
        x = self.embed_tokens(input_ids)
        streams = x.unsqueeze(1).expand(-1, self.hc, -1).contiguous()
        for layer in self.layers:
            streams = layer(streams, ctx)
        for st, n in zip(ctx.states, ctx.query_lens):
            st.advance(n)
        return self.norm(streams.mean(dim=1))
