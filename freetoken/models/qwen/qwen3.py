"""Dense Qwen3: per-head q/k RMSNorm, no biases by default."""
from ..decoder import ArchSpec, tiny_base
from ..llama import DenseCausalLM


class Qwen3ForCausalLM(DenseCausalLM):
    arch = ArchSpec(qk_norm="head")

    @classmethod
    def tiny_config(cls, layers, experts, top_k, hidden, vocab):
        return "Qwen3Config", dict(tiny_base(layers, hidden, vocab), head_dim=hidden // 4,
                                   intermediate_size=2 * hidden)
