"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): q/k/v biases and a shared expert behind a sigmoid gate."""
from .decoder import ArchSpec, MoECausalLM


class Qwen2MoeForCausalLM(MoECausalLM):
    arch = ArchSpec(attn_bias_fields=("qkv_bias",), attn_bias_default=True, shared_expert=True)
