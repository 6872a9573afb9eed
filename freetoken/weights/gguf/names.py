"""GGUF tensor names (llama.cpp's `blk.N.attn_q.weight`) -> the Hugging Face names our model
classes read (`model.layers.N.self_attn.q_proj.weight`), per architecture. Merged expert
tensors (`ffn_*_exps`) are not mapped: they go straight into the expert banks (weights/gguf/reader.py)."""
from __future__ import annotations

import re

import torch

from . import deepseek4 as gguf_deepseek4
from .hybrid import HYBRID, hf_names as hybrid_names

GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
          "output.weight": "lm_head.weight"}

BLOCK = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate_inp": "mlp.gate", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj", "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    # a nextn (multi-token-prediction) block's own tensors (models/mtp_head.py)
    "nextn.eh_proj": "eh_proj", "nextn.enorm": "enorm", "nextn.hnorm": "hnorm",
    "nextn.shared_head_head": "shared_head.head", "nextn.shared_head_norm": "shared_head.norm",
    "nextn.embed_tokens": "embed_tokens",
}

_DEEPSEEK_MOE = {"ffn_gate_shexp": "mlp.shared_experts.gate_proj", "ffn_up_shexp": "mlp.shared_experts.up_proj",
                 "ffn_down_shexp": "mlp.shared_experts.down_proj", "exp_probs_b": "mlp.gate.e_score_correction_bias"}

_MLA = {**_DEEPSEEK_MOE, "attn_q_a": "self_attn.q_a_proj", "attn_q_a_norm": "self_attn.q_a_layernorm",
        "attn_q_b": "self_attn.q_b_proj", "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
        "attn_kv_a_norm": "self_attn.kv_a_layernorm", "attn_kv_b": "self_attn.kv_b_proj"}
_INDEXER = {"indexer.attn_q_b": "self_attn.indexer.wq_b", "indexer.attn_k": "self_attn.indexer.wk",
            "indexer.k_norm": "self_attn.indexer.k_norm", "indexer.proj": "self_attn.indexer.weights_proj"}
MLA_FAMILIES = ("deepseek2", "deepseek32", "glm-dsa")   # kv_b_proj split into attn_k_b / attn_v_b

PER_ARCH = {
    "deepseek2": _MLA,
    "deepseek32": {**_MLA, **_INDEXER},
    "glm-dsa": {**_MLA, **_INDEXER},
    "minimax-m2": {"ffn_gate_inp": "block_sparse_moe.gate", "exp_probs_b": "block_sparse_moe.e_score_correction_bias"},
    "glm4moe": {**_DEEPSEEK_MOE, "post_attention_norm": "post_attention_layernorm"},
    "llama": {"ffn_gate_inp": "block_sparse_moe.gate"},
    "gemma3": {"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm"},
    "gpt-oss": {"ffn_gate_inp": "mlp.router", "post_attention_norm": "post_attention_layernorm",
                "attn_sinks": "self_attn.sinks"},
}

EXPERT_PARTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
_BLK = re.compile(r"blk\.(\d+)\.([a-z0-9_.]+)\.(weight|bias)$")


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
    if part in ("attn_sinks", "exp_probs_b"):        # bare parameters (stored as .weight / .bias)
        return f"model.layers.{layer}.{hf}"
    return f"model.layers.{layer}.{hf}.{kind}"


def hf_names(arch: str, name: str) -> tuple[str, ...]:
    """All HF names GGUF tensor `name` provides (hybrid families: some provide two)."""
    if arch in HYBRID:
        return hybrid_names(name, lambda n: hf_name(arch, n))
    if arch == "deepseek4":
        return gguf_deepseek4.hf_names(name)
    hf = hf_name(arch, name)
    return (hf,) if hf is not None else ()


def derived(arch: str, names) -> dict[str, tuple[str, ...]]:
    """HF tensors the converter split into several GGUF tensors: HF name -> GGUF sources, in
    the order `combine` takes them. deepseek2: kv_b_proj became attn_k_b (transposed per head,
    for llama.cpp's absorbed MLA) and attn_v_b."""
    out = {}
    if arch in MLA_FAMILIES:
        for n in names:
            m = _BLK.match(n)
            if m and m[2] == "attn_k_b" and m[3] == "weight":
                out[f"model.layers.{m[1]}.self_attn.kv_b_proj.weight"] = (n, n.replace("attn_k_b", "attn_v_b"))
    return out


def combine(hf: str, parts: list[torch.Tensor]) -> torch.Tensor:
    """Rebuild kv_b_proj [heads * (nope + v), kv_lora] from k_b [heads, kv_lora, nope] and v_b
    [heads, v, kv_lora] (the inverse of the converter's split)."""
    k_b, v_b = parts
    kv = torch.cat([k_b.transpose(1, 2), v_b], dim=1)
    return kv.reshape(-1, kv.shape[-1]).contiguous()


def split(hf: str, t: torch.Tensor, heads: int, nope: int) -> list[torch.Tensor]:
    """The converter's split of kv_b_proj (what `combine` undoes): [k_b, v_b]."""
    kv = t.reshape(heads, -1, t.shape[-1])
    return [kv[:, :nope].transpose(1, 2).contiguous(), kv[:, nope:].contiguous()]


def unpermute_rows(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's converter permutation of llama-arch q/k rows (its LlamaModel.permute:
    each head's rotary halves interleaved for ggml's adjacent-pair rope)."""
    rows = t.shape[0]
    return t.reshape(heads, rows // heads // 2, 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)


def needs_unpermute(arch: str, hf: str) -> bool:
    return arch == "llama" and hf.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                            "self_attn.q_proj.bias", "self_attn.k_proj.bias"))
