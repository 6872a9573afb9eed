"""The Qwen3-Next / Qwen3.5 checkpoint tensors rounded as llama.cpp's converter stores them:
the converter's forward transform (facts from its conversion/qwen.py: 1 + w norms,
-exp(A_log), value heads re-ordered to tiled order in qwen35moe's out_proj columns),
rounded to the GGUF tensor's type, then transformed back. Row re-orderings commute with
row-wise rounding, so they are not re-done here."""
from __future__ import annotations

import torch

PLUS_ONE = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight", "k_norm.weight")
# checkpoint name suffix -> GGUF tensor of the same block holding it
GGUF_OF = {"in_proj_qkvz.weight": "attn_qkv.weight", "in_proj_ba.weight": "ssm_ba.weight",
           "in_proj_qkv.weight": "attn_qkv.weight", "in_proj_z.weight": "attn_gate.weight",
           "in_proj_b.weight": "ssm_beta.weight", "in_proj_a.weight": "ssm_alpha.weight",
           "conv1d.weight": "ssm_conv1d.weight", "dt_bias": "ssm_dt.bias", "A_log": "ssm_a",
           "norm.weight": "ssm_norm.weight", "out_proj.weight": "ssm_out.weight"}


def _tiled_cols(n_cols: int, hk: int, hv: int, dv: int) -> torch.Tensor:
    """Index of the checkpoint column each tiled (llama.cpp) column holds."""
    return torch.arange(n_cols).reshape(hk, hv // hk, dv).transpose(0, 1).reshape(-1)


def hybrid_rounded(ck, name: str, t: torch.Tensor, roundtrip) -> torch.Tensor | None:
    """`t` (checkpoint tensor `name`) as the GGUF `ck` represents it, or None if `name` is not
    one of the hybrid families' transformed tensors."""
    if name == "model.norm.weight" or (name.endswith(PLUS_ONE) and ".linear_attn." not in name):
        g = "output_norm.weight" if name == "model.norm.weight" else ck._hf[name]
        return roundtrip(t + 1, ck.tensor_info(g).ggml_type) - 1
    if ".linear_attn." not in name:
        return None
    layer, part = name.split(".")[2], name.split(".linear_attn.")[1]
    info = ck.tensor_info(f"blk.{layer}.{GGUF_OF[part]}")
    ty = info.ggml_type
    if part == "in_proj_qkvz.weight":
        assert ck.tensor_info(f"blk.{layer}.attn_gate.weight").ggml_type == ty
    if part == "A_log":
        return torch.log(-roundtrip(-torch.exp(t), ty))
    if part == "conv1d.weight":
        return roundtrip(t.reshape(t.shape[0], t.shape[-1]), ty).reshape(t.shape)
    c = ck.config
    if part == "out_proj.weight" and ck.arch == "qwen35moe" and c["linear_num_key_heads"] != c["linear_num_value_heads"]:
        idx = _tiled_cols(t.shape[1], c["linear_num_key_heads"], c["linear_num_value_heads"],
                          c["linear_value_head_dim"])
        back = torch.empty_like(t)
        back[:, idx] = roundtrip(t[:, idx].contiguous(), ty)
        return back
    return roundtrip(t, ty)
