"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): q/k/v biases and a shared expert behind a sigmoid gate."""
from ..decoder import ArchSpec, MoECausalLM, tiny_base, tiny_moe_inter


class Qwen2MoeForCausalLM(MoECausalLM):
    arch = ArchSpec(attn_bias_fields=("qkv_bias",), attn_bias_default=True, shared_expert=True)

    @classmethod
    def tiny_config(cls, layers, experts, top_k, hidden, vocab):
        return "Qwen2MoeConfig", dict(
            tiny_base(layers, hidden, vocab), intermediate_size=2 * hidden, moe_intermediate_size=tiny_moe_inter(hidden),
            shared_expert_intermediate_size=hidden, num_experts=experts, num_experts_per_tok=top_k)
