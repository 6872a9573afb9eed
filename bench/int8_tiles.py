"""The int8 / mxfp4 experts' prefill dots in ymm against zmm tiles, per core (outside CI).

    PYTHONPATH=. .venv/bin/python bench/int8_tiles.py [--rounds 3] [--tokens 512,2048] [--layers gpt-oss,qwen3-int8]

One thread, CPU time of the calling thread (on a shared machine that approximates a dedicated core):
one routed-expert layer per shape, the kernels' int8 tiles in ymm registers (kernels/c/dots.c) and in
zmm ones (kernels/c/int8_zmm.c) alternating in every round (best of each), checked bit-identical, as
GFLOP/s and a share of this core's vpdpbusd peak (kernels/roofline.py's probe). Layers: gpt-oss's
medium MXFP4 (2880 x 2880, 32 experts top-4, swiglu_oai: bench/common.py's MEDIUM_GPT_OSS) and the
medium Qwen3-MoE in int8 (2048 x 768, 64 experts top-8: vs_llamacpp.py's q8_0 experts)."""
from __future__ import annotations

import argparse
import time

import torch

from freetoken import kernels
from freetoken.experts.execution.cpu import CpuExpertExecutor
from freetoken.experts.formats import quantize_banks
from freetoken.kernels.pool import CpuPool
from freetoken.kernels.roofline import PEAK_KINDS

CLK = time.thread_time
LAYERS = {"gpt-oss": ("mxfp4", 2880, 2880, 32, 4, "swiglu_oai"), "qwen3-int8": ("int8", 2048, 768, 64, 8, "silu")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", default="512,2048")
    ap.add_argument("--layers", default="gpt-oss,qwen3-int8")
    args = ap.parse_args()
    torch.set_num_threads(1)
    lib = kernels.load()
    pool = CpuPool(lib, 1)
    if not lib.ft_set_int8_zmm(1):
        raise SystemExit(f"kernels {lib.ft_isa().decode()}: no zmm int8 tiles in this build")
    it = 200000
    lib.ft_peak_macs(pool.handle, PEAK_KINDS["int8"], it)
    t0 = CLK()
    peak = 2 * lib.ft_peak_macs(pool.handle, PEAK_KINDS["int8"], it) / (CLK() - t0)
    print(f"kernels {lib.ft_isa().decode()}; int8 (vpdpbusd) peak per core {peak / 1e9:.0f} GFLOP/s", flush=True)
    g = torch.Generator().manual_seed(0)
    for name in args.layers.split(","):
        fmt, H, inter, E, top, act = LAYERS[name]
        banks = quantize_banks(torch.randn(E, 2 * inter, H, generator=g) * 0.05,
                               torch.randn(E, H, inter, generator=g) * 0.05, fmt)
        ex = CpuExpertExecutor(banks, fmt, H, inter, activation=act, pool=pool, gemm_tokens=0)
        for tokens in (int(v) for v in args.tokens.split(",")):
            x = torch.randn(tokens, H, generator=g)
            ids = torch.stack([torch.randperm(E, generator=g)[:top] for _ in range(tokens)])
            wts = torch.rand(tokens, top, generator=g)
            flops = 2 * tokens * top * 3 * H * inter
            secs, outs = {"ymm": [], "zmm": []}, {}
            for _ in range(args.rounds):
                for way in ("ymm", "zmm"):
                    lib.ft_set_int8_zmm(int(way == "zmm"))
                    t = CLK()
                    outs[way] = ex.run(x, ids, wts)
                    secs[way].append(CLK() - t)
            same = torch.equal(outs["ymm"], outs["zmm"])
            cells = {w: (min(s), sorted(s)[len(s) // 2]) for w, s in secs.items()}
            print(f"{name} ({fmt}, {H}x{inter}, {E} experts top-{top}), {tokens} tokens: " + ", ".join(
                f"{w} best {b:.3f} s = {flops / b / 1e9:.0f} GFLOP/s ({flops / b / peak:.1%} of int8), median {m:.3f} s"
                for w, (b, m) in cells.items())
                + f"; zmm / ymm speed: best {cells['ymm'][0] / cells['zmm'][0]:.2f}x, median "
                f"{cells['ymm'][1] / cells['zmm'][1]:.2f}x, per round "
                + " ".join(f"{a / b:.2f}" for a, b in zip(secs["ymm"], secs["zmm"]))
                + f"; bit-identical: {same}", flush=True)
        ex.close()
    lib.ft_set_int8_zmm(0)
    pool.close()


if __name__ == "__main__":
    main()
