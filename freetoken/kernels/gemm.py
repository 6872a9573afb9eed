"""The prefill GEMM tiles over bf16 weights (c/gemm_bf16.c) from Python: which modes run here,
and one call y = x @ W^T (+ bias) with x rounded to bf16 and the weight read in place.

Modes: "amx" (tdpbf16ps, where the CPU has AMX-BF16 and the OS grants the tile state),
"vdpbf16ps" (AVX512-BF16), "plain" (the same arithmetic in plain C: what a forced "vdpbf16ps"
runs on builds without the instruction, so tests check the layout on every build)."""
from __future__ import annotations

import ctypes

import torch

from .switch_set import EXECUTOR_RECORDS

GEMM_MODES = {"amx": 1, "vdpbf16ps": 2, "plain": 3}
# Tokens of a routed-expert call (a prefill chunk) from which the kernel runs bf16 experts through
# the tiles (groups of >= 4 tokens; the rest through the dot products), x and h rounded to bf16
# in the whole call; decode steps below it stay exact. Sapphire Rapids, medium expert 2048x768,
# one core: AMX 1.08x the dots at 8 tokens per expert, 4.2x at 64. 66: a verify step (1 + up to 64
# drafted tokens, layers/kernel_rows.GEMV_TOKENS rows) stays on the dot products too, each row the
# bits of a decode step, so drafts never change greedy output (tiles round the whole call to bf16).
EXPERT_MIN_TOKENS = 66
# Tokens of one expert from which, in such a call, experts in llama.cpp block types run through the
# tiles (each weight row decoded once into a bf16 panel, c/ggml_tiles.c) instead of the int8 dots
# (which decode it once per 4 tokens); measured with bench/ggml_kernels.py --prefill (docs/benchmarks.md).
GGML_GROUP_MIN = 16


def set_tiles_rounding(min_tokens: int) -> None:
    """Record the library's expert-tiles switch (choices.set_gemm_tiles) for the torch expert
    executors (experts/execution/numerics.py): calls of >= `min_tokens` tokens round x and h to bf16
    (0: off). A record of the switch set (switch_set.py): an engine's own, installed with it."""
    EXECUTOR_RECORDS["tiles_min"] = int(min_tokens)


def tiles_rounding_min() -> int:
    return EXECUTOR_RECORDS["tiles_min"]


def modes_here(lib: ctypes.CDLL) -> list[str]:
    """The tile modes this kernel build runs on this machine (AMX asks the OS once)."""
    bits = lib.ft_gemm_modes()
    return [m for m, c in GEMM_MODES.items() if bits >> c & 1]


def mode_code(lib: ctypes.CDLL, mode: str) -> int:
    """The C code of `mode` in this build: "vdpbf16ps" without the instruction runs "plain";
    "amx" where it is refused is 0 (the caller's own path)."""
    here = modes_here(lib)
    if mode == "vdpbf16ps" and mode not in here:
        return GEMM_MODES["plain"]
    return GEMM_MODES[mode] if mode in here else 0


def gemm_bf16(pool, code: int, w: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None = None,
              out: torch.Tensor | None = None) -> torch.Tensor | None:
    """x [M, K] fp32 (rows may be strided) @ w [N, K] bf16 (rows may be strided) ^T + bias (fp32)
    -> fp32 [M, N], or None where the mode does not run for this K (the caller falls back)."""
    if x.dtype != torch.float32 or x.stride(-1) != 1:
        x = x.float().contiguous()
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty(m, n, dtype=torch.float32) if out is None else out
    with pool.lock:
        rc = pool.lib.ft_gemm_bf16(pool.handle, code, w.data_ptr(), w.stride(0) * w.element_size(), n, k,
                                   x.data_ptr(), x.stride(0), m, bias.data_ptr() if bias is not None else None,
                                   y.data_ptr(), y.stride(0))
    if rc == -3:
        return None
    if rc != 0:
        raise MemoryError("bf16 GEMM kernel could not allocate its scratch memory")
    return y
