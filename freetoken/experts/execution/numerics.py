"""One answer on every tier: the arithmetic of one routed expert, wherever it runs.

The C kernels (`kernels/c/moe.c`) define it, and every torch executor (the `resident` backend,
the device cache's slots, the CPU executor's prefill split and no-compiler path) computes the
same way, so the cache size and the backend change speed, never the answer:

  1. the expert's input x and its intermediate act(gate(x)) * up(x) are each rounded once as
     the kernels' `prep_range` rounds them:
       fp32 / fp16 / fp8 weights, bf16 weights with fp32 dots:  none (float32)
       bf16 weights with the vdpbf16ps dots (`bf16_dot`), or in
       a call of >= N tokens under the GEMM tiles (kernels/gemm.py): to bf16, round to nearest even
       int8 / mxfp4 / nvfp4 / ggml weights:                     int8 per 32 (llama.cpp's Q8_0
                                                               activations: d = amax/127,
                                                               q = nearbyint(x * (1/d)))
  2. weights dequantized to float32, products summed in float32 (fp32 accumulation);
  3. the gate-weighted sum over a token's experts in float32, rounded to the activations'
     dtype once, at the end (the `Experts` seam).
The results then differ by float32 summation order only. One exception: under ggml_numerics
"auto" the C kernels run a ggml expert with >= GGML_GROUP_MIN tokens of a tiles call on bf16
weights, x and h (kernels/c/ggml_tiles.c); the torch executors keep int8 per 32 there
(tolerance-level differences on a long prefill, docs/gguf.md).

The bf16-dot switch is a global of the C library (`ft_set_bf16_dot`); the models set it through
`set_bf16_dot` here so the torch executors read the same choice. Both are part of the engine's
own switch set (kernels/switch_set.py), in place while the engine computes.
"""
from __future__ import annotations

import torch

from ...kernels.gemm import tiles_rounding_min
from ...kernels.switch_set import EXECUTOR_RECORDS

_QUANTIZED = ("int8", "mxfp4", "nvfp4", "ggml")     # the kernels quantize activations per 32


def set_bf16_dot(lib, on: bool) -> int:
    """Switch the kernels' bf16 dots in `lib` (None: no library) and record the choice for the
    torch executors. Returns the library's mode (0 off, 1 emulated, 2 vdpbf16ps)."""
    EXECUTOR_RECORDS["bf16_dot"] = bool(on)
    return lib.ft_set_bf16_dot(int(on)) if lib is not None else 0


def bf16_dot() -> bool:
    return EXECUTOR_RECORDS["bf16_dot"]


def rounding(fmt: str, bank_dtype: torch.dtype | None = None, tokens: int | None = None) -> str:
    """How the kernels round an expert's activations for banks in `fmt` (the pool's spec fmt,
    "float" with the bank dtype) in a call of `tokens` tokens: "none", "bf16" or "int8x32"."""
    if fmt in _QUANTIZED:
        return "int8x32"
    bf16_weights = fmt == "bf16" or (fmt == "float" and bank_dtype == torch.bfloat16)
    m = tiles_rounding_min()          # the kernels' expert-tiles switch (kernels/gemm.py)
    tiles = m and tokens is not None and tokens >= m
    if bf16_weights and (bf16_dot() or tiles):
        return "bf16"
    return "none"


def round_activations(x: torch.Tensor, mode: str) -> torch.Tensor:
    """float32 [..., n] -> float32 [..., n] as the kernels see it (see the module doc)."""
    if mode == "none":
        return x
    if mode == "bf16":
        return x.to(torch.bfloat16).to(torch.float32)
    if mode != "int8x32":
        raise ValueError(f"activation rounding: expected none|bf16|int8x32, got {mode!r}")
    n = x.shape[-1]
    if n % 32:
        raise ValueError(f"int8 activation blocks need a multiple of 32 elements, got {n}")
    b = x.unflatten(-1, (n // 32, 32))
    d = b.abs().amax(-1, keepdim=True) / 127.0                       # float32, as amax / 127.f
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))           # 1.f / dd, then x * id
    return (torch.round(b * inv) * d).flatten(-2)                    # round(): half to even
