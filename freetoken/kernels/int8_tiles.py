"""The int8-activation expert tiles (int8, mxfp4 weights) in ymm or zmm registers.

The ymm tiles (kernels/c/dots.c's qtile / mtile) and the zmm ones (kernels/c/int8_zmm.c: two weight
rows in the halves of each register) compute every dot with the same bits, so the choice is speed
alone, and it depends on the CPU: a core that issues 512-bit ops as two halves (Zen 4) gains from the
halved instruction count only where the ymm tile is bound by issuing instructions rather than by the
vpdpbusd pipes. A short calibration decides: one expert's prefill-shaped call (gate/up + down over
`tokens` tokens) in both formats, both ways, interleaved."""
from __future__ import annotations

import ctypes

import torch

from . import Desc, load
from .interleaved import timed_interleaved
from .pool import CpuPool

WAYS = ("ymm", "zmm")
FMT_INT8, FMT_MXFP4 = 5, 4              # ft_kernels.h's format codes


def expert_desc(fmt: int, hidden: int, inter: int, g: torch.Generator) -> tuple[Desc, list[torch.Tensor]]:
    """One random expert in `fmt` (int8: bytes + fp16 scales per 32; mxfp4: nibbles + e8m0 per 32,
    values of a usable size) as the kernels' descriptor, and the tensors it points into."""
    def bank(rows, k):
        if fmt == FMT_INT8:
            w = torch.randint(-127, 128, (rows, k), dtype=torch.int8, generator=g).view(torch.uint8)
            s = torch.full((rows, k // 32), 2.0 ** -10, dtype=torch.float16).view(torch.uint8)
        else:
            w = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=g)
            s = torch.randint(118, 124, (rows, k // 32), dtype=torch.uint8, generator=g)
        return w, s
    (gw, gs), (dw, ds) = bank(2 * inter, hidden), bank(hidden, inter)
    d = Desc(fmt=fmt, act=0, H=hidden, I=inter, alpha=1.0, limit=0.0, n_experts=1,
             gu_w=gw.data_ptr(), gu_w_es=gw.numel(), gu_w_rs=gw.stride(0),
             gu_s=gs.data_ptr(), gu_s_es=gs.numel(), gu_s_rs=gs.stride(0),
             dn_w=dw.data_ptr(), dn_w_es=dw.numel(), dn_w_rs=dw.stride(0),
             dn_s=ds.data_ptr(), dn_s_es=ds.numel(), dn_s_rs=ds.stride(0))
    return d, [gw, gs, dw, ds]


def measure_int8_tiles(threads: int, isa: str = "native", hidden: int = 2048, inter: int = 768,
                       tokens: int = 64, reps: int = 3) -> dict:
    """Seconds of one pass per way (kernels/interleaved.py) ("ymm", "zmm"): an int8 and an mxfp4 expert each over
    `tokens` tokens. About a tenth of a second."""
    lib = load(isa)
    pool = CpuPool(lib, threads)
    g = torch.Generator().manual_seed(0)
    experts = [expert_desc(f, hidden, inter, g) for f in (FMT_INT8, FMT_MXFP4)]
    x = torch.randn(tokens, hidden, generator=g)
    ids = torch.zeros(tokens, 1, dtype=torch.int64)
    w = torch.ones(tokens, 1)
    out = torch.zeros(tokens, hidden)

    def run():
        for d, _ in experts:
            lib.ft_moe_run(pool.handle, ctypes.byref(d), x.data_ptr(), 0, tokens, 1, ids.data_ptr(), w.data_ptr(),
                           out.data_ptr())
    was = lib.ft_set_int8_zmm(-1)
    try:
        return timed_interleaved(run, lambda way: lib.ft_set_int8_zmm(int(way == "zmm")), WAYS, reps)
    finally:
        lib.ft_set_int8_zmm(was)
        pool.close()
