"""Dense linear layers y = x W^T + b (attention projections, dense MLPs, shared experts, lm_head).

On the CPU with the compiled kernels the weight stays in its storage format, the checkpoint's
bf16/fp16/fp32 or, with `dense_format="int8"`, int8 with one fp16 scale per 32 inputs (the
size and rounding of llama.cpp's Q8_0). Decode-sized inputs (up to `kernel_rows.GEMV_TOKENS` rows) stream
it through the C GEMV of `freetoken.kernels`, dequantizing inside the dot products, at memory
bandwidth: a bf16 weight moves half the bytes of the fp32 copy torch would need on CPUs without
native bf16, where torch's own bf16 GEMV is ~1.7x slower than ours. Larger inputs (prefill) are
compute bound: the weight is dequantized once per call into a reused fp32 scratch and multiplied
by torch's fp32 GEMM, which beats both torch's bf16 GEMM (2x slower without native bf16) and
our dot-product kernel; where the CPU has native bf16 (AMX, AVX512-BF16) and a calibration
measures torch's bf16 GEMM faster (kernels/choices.py), a bf16 weight is multiplied as stored
in bf16 instead (inputs and outputs rounded to bf16, as llama.cpp's bf16 path rounds inputs), or
by our own GEMM tiles (AMX or vdpbf16ps, kernels/gemm.py: inputs rounded to bf16, fp32 out) where
the calibration measured those fastest.

Elsewhere (CUDA, no C compiler) it is a plain `F.linear` in the compute dtype, with int8
weights dequantized at load so that the numerics match the CPU path."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..experts.formats import FORMATS
from ..kernels.gemm import gemm_bf16
from ..kernels.huge_pages import on_huge_pages
from ..kernels.pool import CpuPool
from ..platform import gemm_aligned
from .concat import cat_rows
from .ggml_linear import GgmlLinear, dequantize_on
from .kernel_rows import decode_rows, fp32_scratch, gemv_operands, rows_apply
from ..quant.fp8 import block_scales, dequantize_fp8_block
from ..quant.int8 import dequantize_int8, quantize_int8

DENSE_FORMATS = ("int8",)
_FMT = {f.dtype: f.code for f in FORMATS.values() if f.is_float}   # the C kernels' format codes
_INT8 = FORMATS["int8"].code
_FP8 = FORMATS["fp8"].code
class Linear:
    """`weight` [N, K] (any float dtype, as loaded), `bias` [N] or None.
    compute_dtype: dtype of inputs/outputs; fmt: None keeps `storage_dtype`, "int8" quantizes;
    pool: the kernels' `CpuPool` (None: torch path); gemm_dtype: bf16 runs prefill GEMMs over bf16
    weights in torch's native bf16 (chosen by kernels/choices.py where measured faster)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                 compute_dtype: torch.dtype, storage_dtype: torch.dtype | None = None,
                 fmt: str | None = None, pool: CpuPool | None = None, gemm_dtype: torch.dtype = torch.float32,
                 scale_inv: torch.Tensor | None = None):
        if fmt is not None and fmt not in DENSE_FORMATS:
            raise ValueError(f"dense_format {fmt!r} is not supported; expected one of {DENSE_FORMATS} or None")
        self.out_features, self.in_features = weight.shape
        self.compute_dtype, self.fmt = compute_dtype, fmt
        self.gemm_dtype = gemm_dtype
        if weight.dtype == torch.float8_e4m3fn:        # FP8 as shipped: kept packed, block scales beside it
            self._init_fp8(weight, scale_inv, bias, pool)
            return
        storage = storage_dtype or weight.dtype
        use_kernel = (pool is not None and weight.device.type == "cpu" and storage in _FMT
                      and (fmt != "int8" or self.in_features % 32 == 0))
        self.pool = pool if use_kernel else None
        self.scales = None
        if fmt == "int8" and (use_kernel or self.in_features % 32 == 0):
            q, s = quantize_int8(weight.float())
            if use_kernel:
                self.weight, self.scales, self.code = q.contiguous(), s.contiguous(), _INT8
            else:
                self.weight = dequantize_int8(q, s, compute_dtype)
        elif use_kernel:
            # the kernels stream it every step: on 2 MiB pages (kernels/huge_pages.py; 2 MiB-aligned)
            self.weight, self.code = gemm_aligned(on_huge_pages(weight, storage)), _FMT[storage]
        else:
            self.weight = gemm_aligned(weight.to(compute_dtype))
        if bias is None:
            self.bias = None
        else:
            self.bias = bias.float().contiguous() if use_kernel else bias.to(compute_dtype)

    def _init_fp8(self, weight, scale_inv, bias, pool):
        """e4m3 weights with one fp32 scale per 128x128 block (DeepSeek-V3 FP8): the C kernels
        read them in place (GEMV, and row dequantization for prefill); elsewhere they are
        dequantized once at load, exactly as transformers does."""
        if scale_inv is None:
            raise ValueError("an FP8 weight needs its weight_scale_inv block scales")
        self.pool = pool if pool is not None and weight.device.type == "cpu" else None
        if self.pool is None:
            self.weight, self.scales = dequantize_fp8_block(weight, scale_inv, self.compute_dtype), None
        else:
            self.weight, self.scales, self.code = weight.contiguous(), scale_inv.float().contiguous(), _FP8
        self.bias = None if bias is None else (bias.float().contiguous() if self.pool else bias.to(self.compute_dtype))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.pool is None:
            return F.linear(x, self.weight, self.bias)
        if decode_rows(x):
            return self._gemv(x)
        return rows_apply(x, self.in_features, self.out_features, self._gemv, self._gemm)

    def _gemv(self, x: torch.Tensor) -> torch.Tensor:
        x, y = gemv_operands(x, self.out_features)
        return self.gemv_on(self.pool, x, y)

    def gemv_on(self, pool: CpuPool, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """This layer's decode GEMV of `x` (contiguous fp32 or bf16 rows) into `y` (fp32 [M, out])
        on `pool`: its own, or a caller's one-thread pool for a GEMV that should not wake the
        shared pool's workers (the disk tier's router guess, experts/disk/lookahead.py). Kernel
        path only (`pool` set)."""
        with pool.lock:
            rc = pool.lib.ft_linear_run(
                pool.handle, *self._weight_args(), x.data_ptr(), 0 if x.dtype == torch.float32 else 1,
                x.shape[0], self.bias.data_ptr() if self.bias is not None else None, y.data_ptr())
        if rc != 0:
            raise MemoryError("dense GEMV kernel could not allocate its scratch memory")
        return y

    def decode_ref(self) -> tuple | None:
        """(kind 0, format code, weights, row bytes, scales, scale row bytes, segments, segment
        count, N, K, bias) as a C caller of this layer's decode GEMV takes them (kernels/c/attn_half.c's
        `ft_dense_ref`); None off the kernel path."""
        if self.pool is None:
            return None
        code, w, w_rs, s, s_rs, n, k = self._weight_args()
        return (0, code, w, w_rs, s, s_rs, None, 0, n, k, self.bias.data_ptr() if self.bias is not None else None)

    def dequantized(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The weight as fp32 [N, K] (into `out` when given)."""
        if self.pool is None:
            return self.weight.float()
        if out is None:
            out = torch.empty(self.out_features, self.in_features, dtype=torch.float32)
        with self.pool.lock:
            self.pool.lib.ft_dequant_rows(self.pool.handle, *self._weight_args(), out.data_ptr())
        return out

    def _weight_args(self) -> tuple:
        """(format code, weights, row bytes, scales, scale row bytes, N, K) as the C kernels take them
        (cached: ~7 us of data_ptr/stride calls per decode GEMV; recomputed if the weight is replaced)."""
        w, s = self.weight, self.scales
        cached = getattr(self, "_args", None)
        if cached is not None and cached[0] is w and cached[1] is s:
            return cached[2]
        args = self._compute_args(w, s)
        self._args = (w, s, args)
        return args

    def _compute_args(self, w, s) -> tuple:
        return (self.code, w.data_ptr(), w.stride(0) * w.element_size(),
                s.data_ptr() if s is not None else None, s.stride(0) * s.element_size() if s is not None else 0,
                self.out_features, self.in_features)

    def _gemm(self, x: torch.Tensor) -> torch.Tensor:
        bf16 = self.gemm_dtype == torch.bfloat16 and self.code == _FMT[torch.bfloat16]
        if bf16 and (tiles := self.pool.lib.ft_get_gemm(1)):
            y = gemm_bf16(self.pool, tiles, self.weight, x, self.bias)   # our AMX / vdpbf16ps tiles
            if y is not None:
                return y
        if bf16:
            y = F.linear(x.to(torch.bfloat16), self.weight).float()   # native bf16 GEMM (AMX, AVX512-BF16)
            return y if self.bias is None else y.add_(self.bias)
        if self.code == _FMT[torch.float32]:
            w = self.weight
        else:
            w = self.dequantized(fp32_scratch(self.weight.shape[0] * self.in_features).view(self.out_features, -1))
        return F.linear(x.float(), w, self.bias)


class LinearFactory:
    """Builds the dense layers of one model with its engine settings."""

    def __init__(self, compute_dtype: torch.dtype, storage_dtype: torch.dtype, fmt: str | None,
                 pool: CpuPool | None, gemm_dtype: torch.dtype = torch.float32):
        """fmt: None, "int8" (requantize float weights) or "float" (GGUF quantized weights
        dequantized at load instead of kept packed)."""
        self.keep_ggml = fmt != "float"
        fmt = None if fmt == "float" else fmt
        self.compute_dtype, self.storage_dtype, self.fmt, self.pool = compute_dtype, storage_dtype, fmt, pool
        self.gemm_dtype = gemm_dtype

    def __call__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, fmt: str | None = "default",
                 scale_inv: torch.Tensor | None = None) -> Linear:
        return Linear(weight, bias, compute_dtype=self.compute_dtype, storage_dtype=self.storage_dtype,
                      fmt=self.fmt if fmt == "default" else fmt, pool=self.pool, gemm_dtype=self.gemm_dtype,
                      scale_inv=scale_inv)

    def load(self, ck, names: list[str], shapes: list[tuple[int, int]], bias: torch.Tensor | None = None,
             fmt: str | None = "default", device=None) -> Linear:
        """One Linear from checkpoint weights `names` stacked by rows. FP8 weights (a
        `<name>_scale_inv` beside them) stay packed when every part but the last fills whole
        128-row blocks; otherwise they are dequantized into the storage dtype."""
        if fmt == "default":
            packed = self.packed(ck, names, shapes, bias, device)
            if packed is not None:
                return packed
        fp8 = [ck.has(f"{n}_scale_inv") for n in names]
        if all(fp8) and all(s[0] % 128 == 0 for s in shapes[:-1]):
            ws = [ck.get(n, s) for n, s in zip(names, shapes)]
            ss = [block_scales(ck.get(f"{n}_scale_inv", (-(-s[0] // 128), -(-s[1] // 128)))) for n, s in zip(names, shapes)]
            if ws[0].dtype == torch.float8_e4m3fn:
                return self(torch.cat(ws).to(device), bias, fmt, scale_inv=torch.cat(ss).to(device))
        parts = []
        for n, s, q in zip(names, shapes, fp8):
            if q:
                w = ck.get(n, s)
                sc = block_scales(ck.get(f"{n}_scale_inv", (-(-s[0] // 128), -(-s[1] // 128))))
                parts.append(dequantize_fp8_block(w, sc).to(self.storage_dtype))
            else:
                parts.append(ck.get_float(n, s, self.storage_dtype))
        return self((torch.cat(parts) if len(parts) > 1 else parts[0]).to(device), bias, fmt)

    def packs_ggml(self, ck, device=None) -> bool:
        """Whether GGUF quantized weights of `ck` stay packed: a GGUF, the C kernels, the CPU."""
        return (self.keep_ggml and self.pool is not None and hasattr(ck, "packed")
                and (device is None or torch.device(device).type == "cpu"))

    def packed(self, ck, names: list[str], shapes: list[tuple[int, int]], bias: torch.Tensor | None = None,
               device=None):
        """A `GgmlLinear` over the GGUF rows of `names` (stacked) when every part is in a type the
        C kernels read and `packs_ggml`; else None (the caller reads floats)."""
        if not self.packs_ggml(ck, device):
            if self.keep_ggml and device is not None and torch.device(device).type != "cpu" and hasattr(ck, "packed"):
                parts = [ck.packed(n, s) for n, s in zip(names, shapes)]
                if all(p is not None for p in parts):     # the GPU: the file's rows, dequantized there
                    return self(dequantize_on(parts, device, self.storage_dtype), bias)
            return None
        parts = [ck.packed(n, s) for n, s in zip(names, shapes)]
        if any(p is None for p in parts):
            return None
        return GgmlLinear(parts, bias, self.pool, self.gemm_dtype)

    def load_rows(self, ck, names: list[str], shapes: list[tuple[int, int]], bias: torch.Tensor | None = None,
                  device=None):
        """Like `load`, but float parts are stacked with `cat_rows` (a view of the file's pages
        when they lie back to back); FP8 parts are dequantized by `get_float`."""
        packed = self.packed(ck, names, shapes, bias, device)
        if packed is not None:
            return packed
        parts = [ck.get_float(n, s, self.storage_dtype) for n, s in zip(names, shapes)]
        parts = [p.to(device) for p in parts] if device is not None else parts
        return self(cat_rows(parts) if len(parts) > 1 else parts[0], bias)
