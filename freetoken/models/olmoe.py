"""OLMoE: q/k RMSNorm over the whole projection (before the head split) and optional clip_qkv."""
from .decoder import ArchSpec, MoECausalLM, tiny_base, tiny_moe_inter


class OlmoeForCausalLM(MoECausalLM):
    arch = ArchSpec(qk_norm="full")

    @classmethod
    def tiny_config(cls, layers, experts, top_k, hidden, vocab):
        return "OlmoeConfig", dict(tiny_base(layers, hidden, vocab), intermediate_size=tiny_moe_inter(hidden),
                                   num_experts=experts, num_experts_per_tok=top_k)

    def expert_intermediate(self) -> int:
        return self.hf.req("intermediate_size")

    def is_moe_layer(self, i):
        return True
