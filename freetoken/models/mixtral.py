"""Mixtral: `block_sparse_moe` with experts w1 (gate), w3 (up), w2 (down); top-k always renormalised."""
from .decoder import ArchSpec, MoECausalLM


class MixtralForCausalLM(MoECausalLM):
    arch = ArchSpec(moe_prefix="block_sparse_moe", expert_names=("w1", "w3", "w2"), always_norm_topk=True)

    def expert_intermediate(self) -> int:
        return self.hf.req("intermediate_size")

    def sliding_window(self, i):
        return self.hf.get("sliding_window") or None
