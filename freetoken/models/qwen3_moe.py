"""Qwen3-MoE: per-head q/k RMSNorm, softmax router with optional top-k renormalisation."""
from .decoder import ArchSpec, MoECausalLM


class Qwen3MoeForCausalLM(MoECausalLM):
    arch = ArchSpec(qk_norm="head")
