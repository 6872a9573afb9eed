"""OLMoE: q/k RMSNorm over the whole projection (before the head split) and optional clip_qkv."""
from .decoder import ArchSpec, MoECausalLM


class OlmoeForCausalLM(MoECausalLM):
    arch = ArchSpec(qk_norm="full")

    def expert_intermediate(self) -> int:
        return self.hf.req("intermediate_size")

    def is_moe_layer(self, i):
        return True
