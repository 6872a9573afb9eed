"""Mistral: Llama with an optional sliding window on every layer."""
from .decoder import tiny_base
from .llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    @classmethod
    def tiny_config(cls, layers, experts, top_k, hidden, vocab):
        return "MistralConfig", dict(tiny_base(layers, hidden, vocab), intermediate_size=2 * hidden,
                                     head_dim=hidden // 4, sliding_window=8)

    def sliding_window(self, i):
        return self.hf.get("sliding_window") or None
