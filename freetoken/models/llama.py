"""Dense decoders of the Llama family (Llama 2/3, SmolLM2, Mistral): every layer a gated MLP,
no experts, so the MoE path (router, pool, experts backend) is never built."""
from .decoder import ArchSpec, MoECausalLM, tiny_base


class DenseCausalLM(MoECausalLM):
    """A decoder without experts: `num_experts()` is 0, so `moe_layers` is empty and
    `self.experts` is None (engine stats and the web page then say "dense model")."""

    dense = True

    def num_experts(self) -> int:
        return 0

    def top_k(self) -> int:
        return 0


class LlamaForCausalLM(DenseCausalLM):
    arch = ArchSpec(attn_bias_fields=("attention_bias",))

    @classmethod
    def tiny_config(cls, layers, experts, top_k, hidden, vocab):
        return "LlamaConfig", dict(tiny_base(layers, hidden, vocab), intermediate_size=2 * hidden,
                                   head_dim=hidden // 4)

