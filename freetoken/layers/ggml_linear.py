"""Dense layers and embeddings kept in llama.cpp's block quantizations (GGUF Q8_0, Q4_0, Q4_K,
Q5_K, Q6_K, MXFP4 tensors), as the file stores them: a Q4_K_M file's attention, shared-expert,
dense-FFN and lm_head weights take their quantized size in memory, not bf16's 3-4x, and
decode reads that many bytes.

Decode-sized inputs (up to `kernel_rows.GEMV_TOKENS` rows) run the C GEMV of kernels/c/ggml_dense.c: the
expert kernels' ggml dot tiles, activations rounded to int8 per 32 like llama.cpp's Q8
activations. Larger inputs (prefill) dequantize row tiles into a reused fp32 scratch (exactly
the values `gguf.quants.dequantize` gives) and multiply them with torch's GEMM. A fused layer
(q|k|v, gate|up) is a list of parts that may differ in type. Embeddings dequantize only the
looked-up rows. Without the C kernels the factory dequantizes at load instead; on a GPU it copies
the packed rows there and dequantizes them with the torch decoders (`dequantize_on`)."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..kernels.pool import CpuPool
from ..quant import ggml_quants as gq
from ..quant.ggml_act import ACT_MODES, q8_rows, sum_rounding
from .kernel_rows import GEMV_TOKENS, decode_rows, fp32_scratch, gemv_operands, rows_apply

KERNEL_TYPES = gq.KERNEL_TYPES   # ggml_dense.c's types
_GGML = 7                    # FMT_GGML of the C kernels
_TILE_FLOATS = 8 << 20       # fp32 scratch per prefill tile (32 MiB)


@dataclass
class GgmlWeight:
    """Rows of one ggml type: `rows` u8 [N, >= row_bytes(type, cols)] (a GGUF tensor's bytes)."""
    rows: torch.Tensor
    type: int
    cols: int

    def __post_init__(self):
        need = gq.row_bytes(self.type, self.cols)
        if self.rows.dtype != torch.uint8 or self.rows.dim() != 2 or self.rows.shape[1] < need:
            raise ValueError(f"ggml {gq.type_name(self.type)} rows of {self.cols} elements need uint8 [N, >= {need}], "
                             f"got {self.rows.dtype} {tuple(self.rows.shape)}")
        if self.rows.stride(1) != 1:
            raise ValueError("ggml rows must have contiguous bytes")

    def dequantize(self) -> torch.Tensor:
        return gq.dequantize(self.rows, self.type, self.cols)


def dequantize_on(parts: list[GgmlWeight], device, dtype: torch.dtype) -> torch.Tensor:
    """The stacked rows of `parts` as a float weight on `device`: each part's packed bytes are
    copied there and dequantized by the torch decoders (bit-exact to gguf.quants), so a GPU
    load never holds the float weight in host memory."""
    return torch.cat([gq.dequantize(p.rows.to(device), p.type, p.cols).to(dtype) for p in parts])


class _Seg(ctypes.Structure):
    _fields_ = [("w", ctypes.c_void_p), ("rs", ctypes.c_int64), ("type", ctypes.c_int32), ("rows", ctypes.c_int32)]


class GgmlLinear:
    """y = x W^T + b with W the rows of `parts` stacked (every part has `cols` inputs)."""

    def __init__(self, parts: list[GgmlWeight], bias: torch.Tensor | None, pool: CpuPool,
                 gemm_dtype: torch.dtype = torch.float32):
        cols = {p.cols for p in parts}
        if len(cols) != 1:
            raise ValueError(f"parts of one layer must have the same inputs, got {sorted(cols)}")
        bad = [gq.type_name(p.type) for p in parts if p.type not in KERNEL_TYPES]
        if bad:
            raise ValueError(f"no CPU kernel for ggml type(s) {bad}; expected one of "
                             f"{[gq.type_name(t) for t in KERNEL_TYPES]}")
        self.parts, self.pool, self.gemm_dtype = parts, pool, gemm_dtype
        self.in_features = cols.pop()
        self.out_features = sum(p.rows.shape[0] for p in parts)
        self.segs = (_Seg * len(parts))(*[_Seg(p.rows.data_ptr(), p.rows.stride(0), p.type, p.rows.shape[0])
                                          for p in parts])
        self._segs_ptr = ctypes.cast(self.segs, ctypes.c_void_p)     # (a cast per decode GEMV was ~1 us)
        self._types = torch.tensor([p.type for p in parts], dtype=torch.int32)
        self.bias = None if bias is None else bias.float().contiguous()
        if self.bias is not None and self.bias.shape != (self.out_features,):
            raise ValueError(f"bias of shape {tuple(self.bias.shape)}, expected ({self.out_features},)")

    @property
    def nbytes(self) -> int:
        return sum(p.rows.shape[0] * gq.row_bytes(p.type, p.cols) for p in self.parts)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        exact = self.pool.lib.ft_set_ggml_act(-1) == ACT_MODES["float32"]    # no int8 GEMV (ggml_act.py)
        if decode_rows(x) and not exact:
            return self._gemv(x)
        return rows_apply(x, self.in_features, self.out_features, self._gemm if exact else self._gemv, self._gemm)

    def decode_ref(self) -> tuple | None:
        """`Linear.decode_ref`'s fields for this layer (kind 1: its segments, ft_ggml_linear_run's
        operands); None where a decode row does not take the GEMV (float32 activations: `exact`)."""
        if self.pool.lib.ft_set_ggml_act(-1) == ACT_MODES["float32"]:
            return None
        return (1, 0, None, 0, None, 0, self._segs_ptr.value, len(self.parts), self.out_features, self.in_features,
                self.bias.data_ptr() if self.bias is not None else None)

    def _gemv(self, x: torch.Tensor) -> torch.Tensor:
        x, y = gemv_operands(x, self.out_features)
        with self.pool.lock:
            rc = self.pool.lib.ft_ggml_linear_run(
                self.pool.handle, self._segs_ptr, len(self.parts), self.in_features,
                x.data_ptr(), 0 if x.dtype == torch.float32 else 1, x.shape[0],
                self.bias.data_ptr() if self.bias is not None else None, y.data_ptr(), self.out_features)
        if rc == -2:
            raise MemoryError("ggml GEMV kernel could not allocate its scratch memory")
        if rc != 0:
            raise ValueError(f"ggml GEMV kernel refused the layer (code {rc})")
        return y

    def _dequantize_rows(self, r0: int, r1: int, out: torch.Tensor) -> torch.Tensor:
        """Rows [r0, r1) of W as fp32 into out [r1 - r0, K] (the C kernels, threads over rows)."""
        K, lib, base = self.in_features, self.pool.lib, 0
        with self.pool.lock:
            for i, (p, s) in enumerate(zip(self.parts, self.segs)):
                n = p.rows.shape[0]
                a, b = max(r0, base), min(r1, base + n)
                if a < b:
                    lib.ft_dequant_rows(self.pool.handle, _GGML, s.w + (a - base) * s.rs, s.rs,
                                        self._types.data_ptr() + 4 * i, n, b - a, K,
                                        out[a - r0:].data_ptr())
                base += n
        return out

    def dequantized(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The weight as fp32 [N, K] (into `out` when given)."""
        if out is None:
            out = torch.empty(self.out_features, self.in_features, dtype=torch.float32)
        return self._dequantize_rows(0, self.out_features, out)

    def _gemm(self, x: torch.Tensor) -> torch.Tensor:
        N, K = self.out_features, self.in_features
        tile = max(64, _TILE_FLOATS // K // 64 * 64)
        bf16 = self.gemm_dtype == torch.bfloat16
        s_corr = None
        if self.pool.lib.ft_set_ggml_act(-1) == ACT_MODES["llama"]:   # llama.cpp's q8 rounding, as the GEMV
            x, s_corr = q8_rows(x)
        x = x.to(torch.bfloat16) if bf16 else x.float()
        y = torch.empty(x.shape[0], N, dtype=torch.float32)
        for r0 in range(0, N, tile):
            r1 = min(N, r0 + tile)
            w = self._dequantize_rows(r0, r1, fp32_scratch((r1 - r0) * K).view(r1 - r0, K))
            w = w.to(torch.bfloat16) if bf16 else w
            if x.shape[0] <= GEMV_TOKENS:   # a decode/verify step (--ggml-numerics float32): row by row, so
                for i in range(x.shape[0]):  # each row has a one-row step's bits (torch's GEMM rounds by M)
                    y[i:i + 1, r0:r1] = F.linear(x[i:i + 1], w)
            else:
                y[:, r0:r1] = F.linear(x, w)
            extra = sum_rounding(s_corr, self.parts, r0, r1) if s_corr is not None else None
            if extra is not None:
                y[:, r0:r1] += extra
        return y if self.bias is None else y.add_(self.bias)


class GgmlEmbedding:
    """Token embeddings from ggml rows: only the looked-up rows are dequantized."""

    def __init__(self, weight: GgmlWeight, dtype: torch.dtype, pool: CpuPool | None = None):
        self.weight, self.dtype = weight, dtype
        # a decode step's few rows by the C dequantizer (exactly gguf.quants' values), not ~10 torch ops
        self.pool = pool if pool is not None and weight.rows.device.type == "cpu" and weight.type in KERNEL_TYPES else None
        self._type = torch.tensor([weight.type], dtype=torch.int32)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if self.pool is not None and ids.numel() <= GEMV_TOKENS and ids.device.type == "cpu":
            rows, (n, rs), cols = self.weight.rows, self.weight.rows.shape, self.weight.cols
            out = torch.empty(ids.numel(), cols, dtype=torch.float32)
            with self.pool.lock:
                for i, t in enumerate(ids.reshape(-1).tolist()):
                    if not 0 <= t < n:
                        raise IndexError(f"token id {t} is out of the embedding's {n} rows")
                    self.pool.lib.ft_dequant_rows(self.pool.handle, _GGML, rows.data_ptr() + t * rows.stride(0), rs,
                                                  self._type.data_ptr(), n, 1, cols, out[i].data_ptr())
            return out.to(self.dtype).reshape(*ids.shape, cols)
        rows = self.weight.rows[ids.reshape(-1)]
        out = gq.dequantize(rows, self.weight.type, self.weight.cols).to(self.dtype)
        return out.reshape(*ids.shape, self.weight.cols)
