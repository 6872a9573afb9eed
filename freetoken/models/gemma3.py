"""Gemma 3 (text): a dense decoder with sandwich norms (a norm after attention and after the
MLP as well as before each), RMSNorm scaling by (1 + weight), embeddings scaled by
sqrt(hidden), gelu-tanh MLP, query scale 1/sqrt(query_pre_attn_scalar), and five sliding-window
layers per full one, the local layers with their own rope base."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..errors import UnsupportedModelError
from ..layers.mlp import GatedMLP
from ..layers.norm import RMSNorm
from ..layers.rope import Rotary
from .context import ForwardContext
from .decoder import ArchSpec, Attention, tiny_base
from .llama import DenseCausalLM


def _gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


class Gemma3Layer:
    def __init__(self, attn, mlp, norms: list[RMSNorm], local: bool):
        self.attn, self.mlp, self.local = attn, mlp, local
        self.input_norm, self.post_attn_norm, self.pre_mlp_norm, self.post_mlp_norm = norms

    def __call__(self, idx, x, cos, sin, ctx: ForwardContext):
        h = x + self.post_attn_norm(self.attn(self.input_norm(x), cos, sin, ctx.kv[idx], ctx.attn))
        return h + self.post_mlp_norm(self.mlp(self.pre_mlp_norm(h)))


class Gemma3ForCausalLM(DenseCausalLM):
    arch = ArchSpec(qk_norm="head")
    tiny_model = "Gemma3ForCausalLM"      # its norm weights randomized (transformers starts them at 0)

    @classmethod
    def tiny_config(cls, layers, experts, top_k, hidden, vocab):
        return "Gemma3TextConfig", dict(
            tiny_base(layers, hidden, vocab), head_dim=hidden // 4, intermediate_size=2 * hidden,
            query_pre_attn_scalar=hidden // 4, sliding_window=8, tie_word_embeddings=True)
        # layer types: transformers' default, five sliding layers then a full one (llama.cpp's too)

    def __init__(self, ck, cfg, max_len):
        if ck.config.get("attn_logit_softcapping"):
            raise UnsupportedModelError(f"{ck.dir}: attn_logit_softcapping is not supported (Gemma 2's; Gemma 3 has none)")
        # GGUF files store norm weights with the +1 already added (llama.cpp's converter)
        self.norm_shift = 0.0 if ck.config.get("norm_weights_shifted") else 1.0
        super().__init__(ck, cfg, max_len)
        self.embed_scale = math.sqrt(self.hidden)
        self.softcap = self.hf.get("final_logit_softcapping")
        self.norm = self._norm_weight(self.norm.weight)
        self.local_rotary = Rotary(self._local_rope(), self.rope_dim(), max_len, self.dtype, self.device)

    # --- config -----------------------------------------------------------------------------
    def rope_config(self) -> dict:
        params = self.hf.get("rope_parameters") or {}
        if "full_attention" in params:
            return self.hf.data
        return {**self.hf.data, "rope_theta": self.hf.get("rope_theta", 1_000_000.0)}

    def _local_rope(self) -> dict:
        local = (self.hf.get("rope_parameters") or {}).get("sliding_attention")
        if local is None:
            local = {"rope_type": "default", "rope_theta": self.hf.get("rope_local_base_freq", 10_000.0)}
        return {"rope_parameters": local, "max_position_embeddings": self.hf.get("max_position_embeddings")}

    def is_sliding(self, i: int) -> bool:
        types = self.hf.get("layer_types")
        if types:
            return types[i] == "sliding_attention"
        return bool((i + 1) % self.hf.get("sliding_window_pattern", 6))

    def sliding_window(self, i: int):
        return self.hf.get("sliding_window") if self.is_sliding(i) else None

    # --- loading ------------------------------------------------------------------------------
    def _norm_weight(self, w: torch.Tensor) -> RMSNorm:
        return RMSNorm((w.float() + self.norm_shift).to(w.dtype), self.eps)

    def _load_layer(self, ck, i: int) -> Gemma3Layer:
        p = f"model.layers.{i}"
        attn = Attention(ck, f"{p}.self_attn", self.hf, self.arch, self.linear, self.device, self.rotary,
                         self.sliding_window(i))
        attn.q_norm, attn.k_norm = self._norm_weight(attn.q_norm.weight), self._norm_weight(attn.k_norm.weight)
        attn.scale = float(self.hf.get("query_pre_attn_scalar", self.head_dim)) ** -0.5
        h, inter, load = self.hidden, self.hf.req("intermediate_size"), self.linear.load
        mlp = GatedMLP(load(ck, [f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight"], [(inter, h), (inter, h)],
                            device=self.device),
                       load(ck, [f"{p}.mlp.down_proj.weight"], [(h, inter)], device=self.device), act=_gelu_tanh)
        names = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
        norms = [self._norm_weight(self._w(ck, f"{p}.{n}.weight", (h,))) for n in names]
        return Gemma3Layer(attn, mlp, norms, self.is_sliding(i))

    # --- compute ------------------------------------------------------------------------------
    def embed_tokens(self, input_ids):
        rows = (self.embed_rows(input_ids) if self.embed_rows is not None
                else F.embedding(input_ids, self.embed))
        return (rows * torch.tensor(self.embed_scale, dtype=rows.dtype)).to(self.dtype)

    def forward(self, input_ids, positions, ctx: ForwardContext):
        x = self.embed_tokens(input_ids)
        full, local = self.rotary.tables(positions), self.local_rotary.tables(positions)
        for i, layer in enumerate(self.layers):
            cos, sin = local if layer.local else full
            x = layer(i, x, cos, sin, ctx)
        return self.norm(x)

    def compute_logits(self, hidden):
        logits = super().compute_logits(hidden)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits
