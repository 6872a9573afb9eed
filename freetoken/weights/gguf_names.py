"""GGUF tensor names (llama.cpp's `blk.N.attn_q.weight`) -> the Hugging Face names our model
classes read (`model.layers.N.self_attn.q_proj.weight`), per architecture. Merged expert
tensors (`ffn_*_exps`) are not mapped: they go straight into the expert banks (gguf.py)."""
from __future__ import annotations

import re

import torch

GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
          "output.weight": "lm_head.weight"}

BLOCK = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate_inp": "mlp.gate", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj", "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}

PER_ARCH = {
    "llama": {"ffn_gate_inp": "block_sparse_moe.gate"},
    "gpt-oss": {"ffn_gate_inp": "mlp.router", "post_attention_norm": "post_attention_layernorm",
                "attn_sinks": "self_attn.sinks"},
}

EXPERT_PARTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
_BLK = re.compile(r"blk\.(\d+)\.([a-z0-9_]+)\.(weight|bias)$")


def hf_name(arch: str, name: str) -> str | None:
    """The HF name of GGUF tensor `name`; None for expert banks and tensors we do not read."""
    if name in GLOBAL:
        return GLOBAL[name]
    m = _BLK.match(name)
    if m is None:
        return None
    layer, part, kind = m.groups()
    if part in EXPERT_PARTS:
        return None
    table = {**BLOCK, **PER_ARCH.get(arch, {})}
    if part not in table:
        return None
    hf = table[part]
    if part == "attn_sinks":        # gpt-oss: a bare parameter
        return f"model.layers.{layer}.{hf}"
    return f"model.layers.{layer}.{hf}.{kind}"


def hf_names(arch: str, name: str) -> tuple[str, ...]:
    """All HF names GGUF tensor `name` provides (hybrid families: some provide two)."""
    from .gguf_hybrid import HYBRID, hf_names as hybrid_names
    if arch in HYBRID:
        return hybrid_names(name, lambda n: hf_name(arch, n))
    hf = hf_name(arch, name)
    return (hf,) if hf is not None else ()


def unpermute_rows(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's converter permutation of llama-arch q/k rows (its LlamaModel.permute:
    each head's rotary halves interleaved for ggml's adjacent-pair rope)."""
    rows = t.shape[0]
    return t.reshape(heads, rows // heads // 2, 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)


def needs_unpermute(arch: str, hf: str) -> bool:
    return arch == "llama" and hf.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                            "self_attn.q_proj.bias", "self_attn.k_proj.bias"))
