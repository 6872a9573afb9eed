"""Mixtral: `block_sparse_moe` with experts w1 (gate), w3 (up), w2 (down); top-k always renormalised."""
from .decoder import ArchSpec, MoECausalLM, tiny_base, tiny_moe_inter


class MixtralForCausalLM(MoECausalLM):
    arch = ArchSpec(moe_prefix="block_sparse_moe", expert_names=("w1", "w3", "w2"), always_norm_topk=True)

    @classmethod
    def tiny_config(cls, layers, experts, top_k, hidden, vocab):
        return "MixtralConfig", dict(tiny_base(layers, hidden, vocab), intermediate_size=tiny_moe_inter(hidden),
                                     num_local_experts=experts, num_experts_per_tok=top_k)

    def expert_intermediate(self) -> int:
        return self.hf.req("intermediate_size")

    def sliding_window(self, i):
        return self.hf.get("sliding_window") or None
