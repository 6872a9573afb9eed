"""What every C-kernel dense layer (`linear.Linear`, `ggml_linear.GgmlLinear`) shares: which
path a call takes by its row count, the GEMV kernels' operands, and the reused fp32 scratch
the prefill path dequantizes into."""
from __future__ import annotations

import threading

import torch

# Rows of x from which dequantize + torch GEMM beats streaming the weight through the GEMV
# (bench/dense_linear.py on the AVX2 dev machine: the GEMV wins up to ~64 tokens). 65 = a
# verify step's 1 + 64 drafted tokens (spec_max_draft <= 64): the GEMV gives each row the bits
# a one-row decode step gives it (its dot of a row does not depend on the other rows), so
# every step of up to 65 rows is batch invariant and speculation never changes greedy output.
GEMV_TOKENS = 65
_scratch = threading.local()


def fp32_scratch(numel: int) -> torch.Tensor:
    """A per-thread fp32 buffer reused across calls: a fresh one per call would page-fault
    its whole size in on every prefill chunk."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.numel() < numel:
        buf = _scratch.buf = torch.empty(numel, dtype=torch.float32)
    return buf[:numel]


def rows_apply(x: torch.Tensor, in_features: int, out_features: int, gemv, gemm) -> torch.Tensor:
    """x [..., K] through a kernel layer: few rows (decode) by `gemv`, many (prefill) by `gemm`,
    back in x's dtype and leading shape."""
    x2 = x if x.dim() == 2 else x.reshape(-1, in_features)
    y = gemv(x2) if x2.shape[0] <= GEMV_TOKENS else gemm(x2)
    if y.dtype != x.dtype:
        y = y.to(x.dtype)
    return y if x.dim() == 2 else y.reshape(*x.shape[:-1], out_features)


def decode_rows(x: torch.Tensor) -> bool:
    """x is a decode step's contiguous fp32 [M <= GEMV_TOKENS, K]: the GEMV takes it as is and
    returns its fp32 rows, so `rows_apply`'s reshapes and casts can be skipped."""
    return x.dtype is torch.float32 and x.dim() == 2 and x.shape[0] <= GEMV_TOKENS and x.is_contiguous()


def gemv_operands(x: torch.Tensor, out_features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The GEMV kernels' input (contiguous fp32 or bf16; the kernel is told which by
    `x.dtype == float32`) and a fresh fp32 output [M, out_features]."""
    if x.dtype not in (torch.float32, torch.bfloat16):
        x = x.float()
    x = x.contiguous()
    return x, torch.empty(x.shape[0], out_features, dtype=torch.float32)
