"""Expert weight formats: bank layouts, codecs, the activation, and the one table of format
names that config, the CLI and the C kernels' callers read.

Bank layouts (leading index = flat id moe_layer*E + expert; I = intermediate, H = hidden):
  fp32/bf16/fp16: gate_up [N, 2I, H] (gate rows then up rows), down [N, H, I]
  fp8:   gate_up float8_e4m3fn [N, 2I, H], gate_up_scale_inv f32 [N, ceil(2I/128), ceil(H/128)],
         down [N, H, I], down_scale_inv [N, ceil(H/128), ceil(I/128)]
  mxfp4: gate_up_blocks u8 [N, 2I, H/32, 16], gate_up_scales u8 [N, 2I, H/32], down_* likewise
  int8:  gate_up int8 [N, 2I, H], gate_up_scales f16 [N, 2I, H/32], down / down_scales likewise
  nvfp4: gate_up_blocks u8 [N, 2I, H/16, 8], gate_up_scales u8 [N, 2I, H/16 + 4] (e4m3 per 16, then
         the row's float32 global scale), down_* likewise (quant/nvfp4.py)
  ggml:  gate u8 [N, I, RBg] and up u8 [N, I, RBu] (banks of their own: their types may differ in
         row width) raw llama.cpp blocks per output row, gate_up_types int32 [N, 2] (ggml type of
         the gate, of the up rows), down u8 [N, H, RBd], down_types int32 [N, 1]; a bank's row
         width is the widest of its types, narrower rows zero-padded (ggml_banks.py; a GGUF's
         layers of different widths get banks each: grouped_pool.py)
  optional: gate_up_bias f32 [N, 2I], down_bias f32 [N, H]
An `ExpertSpec` says "float" for the three float formats (the bank dtype tells which).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..quant.ggml_quants import Q8_0
from .ggml_banks import dequantize_ggml_expert, quantize_ggml
from ..quant.fp8 import dequantize_fp8_block, quantize_fp8_block
from ..quant.int8 import dequantize_int8, quantize_int8
from ..quant.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from ..quant.nvfp4 import dequantize_bank as dequantize_nvfp4_bank, quantize_bank as quantize_nvfp4_bank


@dataclass(frozen=True)
class Format:
    name: str
    code: int                        # the C kernels' FMT_* (freetoken/kernels/c/ft_kernels.h)
    keys: tuple[str, str, str, str]  # gate_up weights, gate_up scales, down weights, down scales ('' = none)
    dtype: torch.dtype | None = None  # float formats: the bank dtype
    block: int = 1                   # hidden and intermediate must be multiples of this
    quantize: Callable | None = None    # float [.., rows, cols] -> (weights, scales)
    dequantize: Callable | None = None  # (weights, scales, dtype) -> float [rows, cols]
    group: int = 1                   # input elements per index of the weight bank's dim 2 (packed blocks)
    up: str = ""                     # the up rows' own bank ('' = rows I.. of the gate_up weights)

    @property
    def is_float(self) -> bool:
        return self.dtype is not None


_FLOAT_KEYS = ("gate_up", "", "down", "")
FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("fp32", 0, _FLOAT_KEYS, torch.float32),
    Format("bf16", 1, _FLOAT_KEYS, torch.bfloat16),
    Format("fp16", 2, _FLOAT_KEYS, torch.float16),
    Format("fp8", 3, ("gate_up", "gate_up_scale_inv", "down", "down_scale_inv"), None, 1,
           quantize_fp8_block, dequantize_fp8_block),
    Format("mxfp4", 4, ("gate_up_blocks", "gate_up_scales", "down_blocks", "down_scales"), None, 32,
           quantize_mxfp4, dequantize_mxfp4, group=32),
    Format("int8", 5, ("gate_up", "gate_up_scales", "down", "down_scales"), None, 32,
           quantize_int8, dequantize_int8),
    # the kernels quantize activations per 32 (like mxfp4), hence block 32 for 16-element groups
    Format("nvfp4", 6, ("gate_up_blocks", "gate_up_scales", "down_blocks", "down_scales"), None, 32,
           quantize_nvfp4_bank, dequantize_nvfp4_bank, group=16),
    # llama.cpp's quantizations as read from GGUF files, a type per expert tensor (ggml_banks.py);
    # requantizing float experts to "ggml" gives Q8_0
    Format("ggml", 7, ("gate", "gate_up_types", "down", "down_types"), None, 32, up="up"),
)}
FORMAT_NAMES = tuple(FORMATS)
ACTIVATIONS = {"silu": 0, "swiglu_oai": 1, "silu_clamp": 2}     # name -> the C kernels' ACT_*


def get_format(fmt: str) -> Format:
    try:
        return FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown expert format {fmt!r}; expected one of {FORMAT_NAMES}") from None


def spec_format(fmt: str) -> str:
    """The `ExpertSpec.fmt` of banks in `fmt`: "float" for the float formats."""
    return "float" if get_format(fmt).is_float else fmt


def weight_keys(fmt: str) -> tuple[str, str, str, str]:
    """(gate_up weights, gate_up scales, down weights, down scales) bank names; scales '' if none."""
    return get_format(fmt).keys


def weight_banks(fmt: str) -> tuple[str, ...]:
    """Every bank of an expert's weights and scales in `fmt` (what a routed expert streams)."""
    f = get_format(fmt)
    return tuple(k for k in (*f.keys, f.up) if k)


def resolve_format(banks: dict[str, torch.Tensor], fmt: str) -> str:
    """Accepts the pool's generic "float" and names the concrete float format from the dtype."""
    if fmt == "float":
        for f in FORMATS.values():
            if f.is_float and banks["gate_up"].dtype == f.dtype:
                return f.name
        raise ValueError(f"float banks of dtype {banks['gate_up'].dtype} are not supported")
    return get_format(fmt).name


def quantize_banks(gate_up: torch.Tensor, down: torch.Tensor, fmt: str) -> dict[str, torch.Tensor]:
    """Float banks gate_up [N, 2I, H] and down [N, H, I] -> banks in `fmt` (biases not included)."""
    f = get_format(fmt)
    if f.is_float:
        return {"gate_up": gate_up.to(f.dtype).contiguous(), "down": down.to(f.dtype).contiguous()}
    if f.name == "ggml":
        return quantize_ggml(gate_up, down, Q8_0)
    gk, gsk, dk, dsk = f.keys
    gu, gus = f.quantize(gate_up)
    dn, dns = f.quantize(down)
    return {gk: gu, gsk: gus, dk: dn, dsk: dns}


def dequantize_expert(banks: dict[str, torch.Tensor], fmt: str, fid: int,
                      dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate_up [2I, H], down [H, I]) of flat expert `fid` in `dtype`."""
    f = get_format(resolve_format(banks, fmt))
    gk, gsk, dk, dsk = f.keys
    if f.is_float:
        return banks[gk][fid].to(dtype), banks[dk][fid].to(dtype)
    if f.name == "ggml":
        return dequantize_ggml_expert(banks, fid, dtype)
    gu = f.dequantize(banks[gk][fid], banks[gsk][fid], dtype)
    dn = f.dequantize(banks[dk][fid], banks[dsk][fid], dtype)
    return gu.reshape(gu.shape[0], -1), dn.reshape(dn.shape[0], -1)


def activate(gate: torch.Tensor, up: torch.Tensor, activation: str, alpha: float = 1.702,
             limit: float = 7.0) -> torch.Tensor:
    """act(gate) * up, the expert's activation (what the C kernels' act_fn computes)."""
    if activation == "silu":
        return F.silu(gate) * up
    if activation == "silu_clamp":   # DeepSeek-V4: gate clamped above, up on both sides
        return F.silu(gate.clamp(max=limit)) * up.clamp(min=-limit, max=limit)
    if activation == "swiglu_oai":   # gpt-oss: transformers' GptOssExperts._apply_gate
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))
    raise ValueError(f"unknown expert activation {activation!r}; expected one of {tuple(ACTIVATIONS)}")
