"""Qwen3-MoE: per-head q/k RMSNorm, softmax router with optional top-k renormalisation."""
from ..decoder import ArchSpec, MoECausalLM, tiny_base, tiny_moe_inter


class Qwen3MoeForCausalLM(MoECausalLM):
    arch = ArchSpec(qk_norm="head")

    @classmethod
    def tiny_config(cls, layers, experts, top_k, hidden, vocab):
        return "Qwen3MoeConfig", dict(
            tiny_base(layers, hidden, vocab), head_dim=hidden // 4, intermediate_size=2 * hidden,
            moe_intermediate_size=tiny_moe_inter(hidden), num_experts=experts, num_experts_per_tok=top_k,
            norm_topk_prob=True)
