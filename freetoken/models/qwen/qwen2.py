"""Dense Qwen2 / Qwen2.5: Llama with q/k/v biases (o_proj has none); the draft models of Qwen MoEs."""
from ..decoder import ArchSpec, tiny_base
from ..llama import DenseCausalLM


class Qwen2ForCausalLM(DenseCausalLM):
    arch = ArchSpec(attn_bias_fields=(), attn_bias_default=True)

    @classmethod
    def tiny_config(cls, layers, experts, top_k, hidden, vocab):
        return "Qwen2Config", dict(tiny_base(layers, hidden, vocab), intermediate_size=2 * hidden)
