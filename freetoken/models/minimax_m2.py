"""MiniMax-M2 / M2.1 (`MiniMaxM2ForCausalLM`): GQA with q/k RMSNorm over the whole projection
(before the head split) and partial rotary (released configs give `rotary_dim`, half the head);
every layer is MoE, `block_sparse_moe` with experts w1 (gate), w3 (up), w2 (down), routed on
sigmoid scores plus a selection-only `e_score_correction_bias`, the top-k weights always
renormalised: no expert groups, no scaling factor, no shared expert. Multi-token-prediction
modules are never read."""
from __future__ import annotations

import torch

from ..layers.linear import Linear
from ..layers.moe import BiasCorrectedMoE
from .decoder import ArchSpec, MoECausalLM, tiny_base, tiny_moe_inter

ROPE_THETA = 5000000.0      # MiniMaxM2Config's default base


class MiniMaxM2ForCausalLM(MoECausalLM):
    arch = ArchSpec(qk_norm="full", moe_prefix="block_sparse_moe", expert_names=("w1", "w3", "w2"))

    @classmethod
    def tiny_config(cls, layers, experts, top_k, hidden, vocab):
        return "MiniMaxM2Config", dict(
            tiny_base(layers, hidden, vocab), head_dim=hidden // 4, intermediate_size=tiny_moe_inter(hidden),
            num_local_experts=experts, num_experts_per_tok=top_k, rotary_dim=hidden // 8)

    def rope_config(self) -> dict:
        """transformers' reading: `rotary_dim` implies partial_rotary_factor = rotary_dim / head_dim
        unless a factor is given; the base defaults to 5e6."""
        data, rope = self.hf.data, self.hf.data.get("rope_parameters") or {}
        implied = {}
        if "partial_rotary_factor" not in data and "partial_rotary_factor" not in rope \
                and self.hf.get("rotary_dim") is not None:
            implied["partial_rotary_factor"] = self.hf.req("rotary_dim") / self.head_dim
        if "rope_theta" not in data and "rope_theta" not in rope:
            implied["rope_theta"] = ROPE_THETA
        return {**data, **implied}

    def expert_intermediate(self) -> int:
        return self.hf.req("intermediate_size")

    def is_moe_layer(self, i: int) -> bool:
        return True

    def sliding_window(self, i: int) -> None:
        return None     # every layer attends to the whole context

    def _load_moe(self, ck, i: int):
        p, e = f"model.layers.{i}.block_sparse_moe", self.num_experts()
        # routing decides on fp32 scores (transformers takes the sigmoid of fp32 logits)
        router = Linear(ck.get_float(f"{p}.gate.weight", (e, self.hidden)).to(self.device),
                        compute_dtype=torch.float32, storage_dtype=torch.float32, pool=self.linear.pool)
        bias_name = f"{p}.e_score_correction_bias"
        bias = (ck.get_float(bias_name, (e,)) if ck.has(bias_name) else torch.zeros(e)).to(self.device)
        return BiasCorrectedMoE(self.moe_layers.index(i), router, self.experts, self.top_k(), True, bias,
                                n_group=1, topk_group=1, scale=1.0)
