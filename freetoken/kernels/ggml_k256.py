"""The k-quant rows' activations in decode-sized calls: per 256 or per 32.

Every ggml row reads activations quantized per 32 (int8 + an fp32 scale, llama.cpp's Q8_0 way),
and a k-quant super-block then costs, per 32 weights, an integer dot, a convert and an fma with
its float sub-scale. With activations quantized per 256 (kernels/c/ggml_act.c's ggml_prep256,
llama.cpp's Q8_K: one fp32 scale per 256 and int16 sums per 16) the 8 or 16 integer sums of a
Q2_K .. Q6_K super-block are scaled by their integer sub-scales and summed in integer, the mins
taken off with the sums, and one convert + fma is left per 256 weights (kernels/c/ggml.c's
krow): the numerics of llama.cpp's own k-quant dots, a coarser rounding than the per-32 one.

Same bytes, fewer instructions per byte; whether that is faster depends on the CPU (on an
AVX512-VNNI core the per-32 loop already takes two blocks per instruction), so under ggml_numerics
"auto" a short calibration decides: Q4_K and Q6_K GEMVs of 1 and 4 rows streamed from DRAM, both
ways, interleaved. "q8k" forces the per-256 activations, "q8" / "llama" / "float32" keep theirs."""
from __future__ import annotations

import ctypes

import torch

from ..quant import ggml_quants as gq
from . import load
from .interleaved import timed_interleaved
from .pool import CpuPool

WAYS = ("q8", "q8k")            # the switch off (per 32) and on (per 256)


class _Seg(ctypes.Structure):   # ft_gseg (ft_kernels.h)
    _fields_ = [("w", ctypes.c_void_p), ("rs", ctypes.c_int64), ("type", ctypes.c_int32), ("rows", ctypes.c_int32)]


def _tame(rows: torch.Tensor, t: int) -> torch.Tensor:
    """Random valid blocks with every fp16 scale 2^-10: products of a usable size."""
    blk = rows.view(rows.shape[0], -1, gq.block_bytes(t))
    for off in gq.f16_scale_offsets(t):
        blk[..., off], blk[..., off + 1] = 0x00, 0x14
    return rows


def measure_k256(threads: int, isa: str = "native", hidden: int = 2048, inter: int = 768,
                 tokens: tuple[int, ...] = (1, 4), reps: int = 3, out_of_cache: int = 64 << 20) -> dict:
    """Seconds of one pass per way (kernels/interleaved.py) ("q8", "q8k"): a Q4_K [2 inter, hidden] and a Q6_K
    [hidden, inter] GEMV (an expert's gate/up and down) for each row count in `tokens`, copies
    rotated past `out_of_cache` bytes as a decode step streams its weights. Well under a second."""
    lib = load(isa)
    pool = CpuPool(lib, threads)
    g = torch.Generator().manual_seed(0)
    shapes = ((gq.Q4_K, 2 * inter, hidden), (gq.Q6_K, hidden, inter))
    one = sum(n * gq.row_bytes(t, k) for t, n, k in shapes)
    mats = [[_tame(gq.random_rows(t, n, k, g), t) for t, n, k in shapes] for _ in range(max(1, out_of_cache // one))]
    segs = [[_Seg(w.data_ptr(), w.stride(0), t, n) for w, (t, n, _) in zip(ws, shapes)] for ws in mats]
    xs = {(m, k): torch.randn(m, k, generator=g) for m in tokens for _, _, k in shapes}
    ys = {(m, n): torch.empty(m, n) for m in tokens for _, n, _ in shapes}

    def run():
        for ss in segs:
            for s, (_, n, k) in zip(ss, shapes):
                for m in tokens:
                    x, y = xs[(m, k)], ys[(m, n)]
                    lib.ft_ggml_linear_run(pool.handle, ctypes.byref(s), 1, k, x.data_ptr(), 0, m, None,
                                           y.data_ptr(), n)
    was = lib.ft_set_ggml_k256(-1)
    try:
        return timed_interleaved(run, lambda way: lib.ft_set_ggml_k256(int(way == "q8k")), WAYS, reps)
    finally:
        lib.ft_set_ggml_k256(was)
        pool.close()
