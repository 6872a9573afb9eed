"""Qwen3-Next (`qwen3next`) and Qwen3.5/3.6-MoE (`qwen35moe`) GGUFs: names and the inverse of
what llama.cpp's converter (conversion/qwen.py, Qwen3NextModel and
_LinearAttentionVReorderBase) does to the gated-DeltaNet and norm tensors:
  - every `*norm.weight` except the DeltaNet's own norm is stored as 1 + w  -> subtract 1;
  - `A_log` is stored as ssm_a = -exp(A_log)                                -> log(-ssm_a);
  - `dt_bias` is stored as ssm_dt.bias; conv1d [C, 1, K] squeezed to [C, K];
  - qwen3next: in_proj_qkvz regrouped to attn_qkv [q|k|v] + attn_gate [z] (the Qwen3.5
    layout our DeltaNet reads); in_proj_ba kept grouped per key head as ssm_ba -> split
    here into in_proj_b / in_proj_a;
  - qwen35moe with fewer key than value heads: the value heads re-ordered from grouped
    (per key head) to tiled order in the v rows of attn_qkv, attn_gate, ssm_alpha/beta,
    ssm_a, ssm_dt, the v channels of ssm_conv1d and the columns of ssm_out -> re-grouped.
The HF names produced are the Qwen3.5 ones (linear_attn.in_proj_qkv/z/b/a, ...)."""
from __future__ import annotations

import re

import torch

HYBRID = ("qwen3next", "qwen35moe")
_BLK = re.compile(r"blk\.(\d+)\.([a-z0-9_]+)(?:\.(weight|bias))?$")

# GGUF block tensor -> HF names under model.layers.N (several when one GGUF tensor holds two)
NAMES = {
    "attn_norm.weight": ("input_layernorm.weight",),
    "post_attention_norm.weight": ("post_attention_layernorm.weight",),
    "attn_qkv.weight": ("linear_attn.in_proj_qkv.weight",),
    "attn_gate.weight": ("linear_attn.in_proj_z.weight",),
    "ssm_ba.weight": ("linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight"),
    "ssm_beta.weight": ("linear_attn.in_proj_b.weight",),
    "ssm_alpha.weight": ("linear_attn.in_proj_a.weight",),
    "ssm_a": ("linear_attn.A_log",),
    "ssm_dt.bias": ("linear_attn.dt_bias",),
    "ssm_conv1d.weight": ("linear_attn.conv1d.weight",),
    "ssm_norm.weight": ("linear_attn.norm.weight",),
    "ssm_out.weight": ("linear_attn.out_proj.weight",),
}
_PLUS_ONE = ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_norm.weight",
             "self_attn.k_norm.weight")


def hf_names(name: str, fallback) -> tuple[str, ...]:
    """HF names of GGUF tensor `name`; `fallback(name)` (the common table) for the rest."""
    m = _BLK.match(name)
    if m is not None:
        layer, part, kind = m.groups()
        hit = NAMES.get(f"{part}.{kind}" if kind else part)
        if hit:
            return tuple(f"model.layers.{layer}.{h}" for h in hit)
    hf = fallback(name)
    return (hf,) if hf is not None else ()


def _grouped(t: torch.Tensor, dim: int, hk: int, hv: int, width: int) -> torch.Tensor:
    """Value heads from llama.cpp's tiled order [r, hk] back to HF's grouped [hk, r] along dim."""
    r = hv // hk
    shape = list(t.shape)
    t = t.movedim(dim, 0)
    t = t.reshape(r, hk, width, *t.shape[1:]).transpose(0, 1).reshape(hv * width, *t.shape[1:])
    return t.movedim(0, dim).reshape(shape).contiguous()


def undo(arch: str, hf: str, t: torch.Tensor, cfg: dict) -> torch.Tensor:
    """The HF tensor `hf` from the GGUF tensor `t` it was converted into."""
    if hf == "model.norm.weight" or hf.endswith(_PLUS_ONE):
        return t - 1
    if ".linear_attn." not in hf:
        return t
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    part = hf.split(".linear_attn.")[1]
    if arch == "qwen3next" and part in ("in_proj_b.weight", "in_proj_a.weight"):
        r = hv // hk                        # ssm_ba: per key head [b * r, a * r]
        b, a = t.reshape(hk, 2 * r, t.shape[-1]).split([r, r], dim=1)
        t = (b if part == "in_proj_b.weight" else a).reshape(hv, t.shape[-1])
    if part == "A_log":
        t = torch.log(-t.float()).to(t.dtype)
    if arch != "qwen35moe" or hk == hv:
        return t
    if part == "in_proj_qkv.weight":
        return torch.cat([t[:2 * hk * dk], _grouped(t[2 * hk * dk:], 0, hk, hv, dv)])
    if part == "conv1d.weight":
        return torch.cat([t[:2 * hk * dk], _grouped(t[2 * hk * dk:], 0, hk, hv, dv)])
    if part == "in_proj_z.weight":
        return _grouped(t, 0, hk, hv, dv)
    if part in ("in_proj_b.weight", "in_proj_a.weight", "A_log", "dt_bias"):
        return _grouped(t, 0, hk, hv, 1)
    if part == "out_proj.weight":
        return _grouped(t, 1, hk, hv, dv)
    return t


def rows_only(arch: str, hf: str, cfg: dict) -> bool:
    """Whether `undo` only selects or reorders whole rows of `hf` (so it can act on quantized
    rows): all but qwen35moe's out_proj with regrouped value heads (its columns move)."""
    return not (arch == "qwen35moe" and hf.endswith(".linear_attn.out_proj.weight")
                and cfg["linear_num_key_heads"] != cfg["linear_num_value_heads"])


def config_fields(c: dict, m, tensors) -> None:
    """The DeltaNet / hybrid-layout fields of the HF config from `{arch}.ssm.*` metadata."""
    c["linear_conv_kernel_dim"] = int(m.req("ssm.conv_kernel"))
    c["linear_key_head_dim"] = int(m.req("ssm.state_size"))
    c["linear_num_key_heads"] = int(m.req("ssm.group_count"))
    c["linear_num_value_heads"] = hv = int(m.req("ssm.time_step_rank"))
    c["linear_value_head_dim"] = int(m.req("ssm.inner_size")) // hv
    recurrent = m.get("attention.recurrent_layers")
    if recurrent is None:
        interval = int(m.get("full_attention_interval", 4))
        recurrent = [(i + 1) % interval != 0 for i in range(c["num_hidden_layers"])]
    c["layer_types"] = ["linear_attention" if r else "full_attention" for r in recurrent[:c["num_hidden_layers"]]]
    c["shared_expert_intermediate_size"] = int(m.req("expert_shared_feed_forward_length"))
    c["attention_bias"] = "blk.0.attn_q.bias" in tensors or any(
        n.endswith(".attn_q.bias") for n in tensors)
    c["decoder_sparse_step"], c["mlp_only_layers"] = 1, []
