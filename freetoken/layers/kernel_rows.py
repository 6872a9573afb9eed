"""What every C-kernel dense layer (`linear.Linear`, `ggml_linear.GgmlLinear`) shares: which
path a call takes by its row count, the GEMV kernels' operands, and the reused fp32 scratch
the prefill path dequantizes into."""
from __future__ import annotations

import threading

import torch

# Rows of x from which dequantize + torch GEMM beats streaming the weight through the GEMV
# (bench/dense_linear.py on the AVX2 dev machine: the GEMV wins up to ~64 tokens).
GEMV_TOKENS = 64
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
    x2 = x.reshape(-1, in_features)
    y = gemv(x2) if x2.shape[0] <= GEMV_TOKENS else gemm(x2)
    if y.dtype != x.dtype:
        y = y.to(x.dtype)
    return y if x.dim() == 2 else y.reshape(*x.shape[:-1], out_features)


def gemv_operands(x: torch.Tensor, out_features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The GEMV kernels' input (contiguous fp32 or bf16; the kernel is told which by
    `x.dtype == float32`) and a fresh fp32 output [M, out_features]."""
    if x.dtype not in (torch.float32, torch.bfloat16):
        x = x.float()
    x = x.contiguous()
    return x, torch.empty(x.shape[0], out_features, dtype=torch.float32)
