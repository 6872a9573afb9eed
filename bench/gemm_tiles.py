"""Prefill GEMMs over bf16 weights per core, as shares of this core's measured peak (outside CI).

    PYTHONPATH=. .venv/bin/python bench/gemm_tiles.py [--rounds 3] [--shapes 512x2048x2048,4096x2048x2048] [--copy-once 0]
        [--expert-tokens 512,2048,4096]

One thread, CPU time of the calling thread (on a shared machine that approximates a dedicated
core): the peak multiply-add rate per format (kernels/roofline.py's probes), the AMX tile loop's
own rate with its packed x in L1, L2 and L3 (the ceiling of the GEMMs' structure), then dense GEMMs of
the medium model's shapes through our tiles (AMX, vdpbf16ps where they run), torch's bf16 GEMM
(oneDNN) and dequantize + torch fp32, and one routed-expert layer of the medium model at 512
tokens through the tiles vs the dot products. Rounds alternate the paths; best of each."""
from __future__ import annotations

import argparse
import time

import torch

from freetoken import kernels
from freetoken.experts.execution.cpu import CpuExpertExecutor
from freetoken.experts.formats import quantize_banks
from freetoken.kernels.gemm import GEMM_MODES, gemm_bf16, modes_here
from freetoken.kernels.pool import CpuPool
from freetoken.kernels.roofline import PEAK_KINDS, tile_ceilings

CLK = time.thread_time


def best_of(fns: dict, rounds: int) -> dict:
    out = {}
    for _ in range(rounds):
        for k, f in fns.items():
            f()
            t = CLK()
            f()
            out[k] = min(out.get(k, 1e9), CLK() - t)
    return out


def expert_layer(lib, pool, tiles, peak, ceil, tokens, rounds, g):
    """One routed-expert layer of the medium model (64 experts top-8, 2048 x 768, bf16) at `tokens`."""
    H, inter, E, top = 2048, 768, 64, 8
    banks = quantize_banks(torch.randn(E, 2 * inter, H, generator=g) * 0.05, torch.randn(E, H, inter, generator=g) * 0.05,
                           "bf16")
    ex = CpuExpertExecutor(banks, "bf16", H, inter, pool=pool, gemm_tokens=0)
    x = torch.randn(tokens, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:top] for _ in range(tokens)])
    wts = torch.rand(tokens, top, generator=g)
    flops = 2 * tokens * top * 3 * H * inter
    fns = {}
    for mode in ["dots", *tiles] if tokens <= 512 else tiles:
        def run(mode=mode):
            lib.ft_set_gemm(GEMM_MODES.get(mode, 0), 16, 0)
            ex.run(x, ids, wts)
        fns[mode] = run
    r = best_of(fns, max(1, rounds - 1))
    lib.ft_set_gemm(0, 16, 0)
    print(f"medium expert layer, {tokens} tokens: " + ", ".join(
        f"{k} {s * 1e3:.0f} ms = {flops / s / 1e9:.0f} GFLOP/s ({flops / s / peak[ceil.get(k, 'fp32')]:.1%} "
        f"of {ceil.get(k, 'fp32')})" for k, s in r.items()), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default="512x2048x2048,512x6144x2048,512x2048x4096,64x1536x2048,512x3000x2048,"
                    "4096x2048x2048", help="comma list of MxNxK dense GEMMs (tokens x rows x columns)")
    ap.add_argument("--copy-once", type=int, default=-1,
                    help="chunks of tokens from which a dense AMX GEMM copies the weights once per call (0: per chunk)")
    ap.add_argument("--expert-tokens", default="512", help="comma list of token counts of the routed-expert layer")
    args = ap.parse_args()
    torch.set_num_threads(1)
    lib = kernels.load()
    lib.ft_gemm_copy_once(args.copy_once)
    print(f"dense AMX GEMMs copy the weights once per call from {lib.ft_gemm_copy_once(-1)} chunks of tokens (0: per chunk)")
    pool = CpuPool(lib, 1)
    peak = {}
    for name, kind in PEAK_KINDS.items():
        if lib.ft_peak_macs(pool.handle, kind, 1) < 0:
            continue
        it = 20000 if name.startswith("amx") else 200000
        t = min(best_of({0: lambda: lib.ft_peak_macs(pool.handle, kind, it)}, args.rounds).values())
        peak[name] = 2 * lib.ft_peak_macs(pool.handle, kind, it) / t
    print("peak GFLOP/s per core: " + ", ".join(f"{k} {v / 1e9:.0f}" for k, v in peak.items()))
    ceilings = tile_ceilings(lib, rounds=args.rounds + 2)
    if ceilings:    # the tiles' own loop (A's sub-panel in L1) by where the packed x sits: what the GEMMs below can reach
        print("AMX tile loop GFLOP/s per core, best / median (share of the amx_bf16 peak): " + ", ".join(
            f"{k} {b / 1e9:.0f} / {m / 1e9:.0f} ({b / peak['amx_bf16']:.0%})" for k, (b, m) in ceilings.items()), flush=True)
    tiles = [m for m in modes_here(lib) if m != "plain"]
    ceil = {"amx": "amx_bf16", "vdpbf16ps": "bf16", "torch_bf16": "amx_bf16" if "amx_bf16" in peak else "bf16",
            "torch_fp32": "fp32"}
    ceil = {k: v if v in peak else "fp32" for k, v in ceil.items()}   # an AVX2 CPU has only the fp32 FMA peak
    g = torch.Generator().manual_seed(0)
    print(f"{'M x N x K':>20} " + " ".join(f"{k:>22}" for k in [*tiles, "torch_bf16", "torch_fp32"]))
    for m, n, k in (tuple(int(v) for v in sh.split("x")) for sh in args.shapes.split(",") if sh):
        x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g).bfloat16()
        w32, y = torch.empty(n, k), torch.empty(m, n)
        fns = {t: (lambda t=t: gemm_bf16(pool, GEMM_MODES[t], w, x, out=y)) for t in tiles}
        fns["torch_bf16"] = lambda: torch.nn.functional.linear(x.bfloat16(), w).float()
        fns["torch_fp32"] = lambda: torch.nn.functional.linear(x, w32.copy_(w))
        r = best_of(fns, args.rounds)
        cells = []
        for key, s in r.items():
            rate = 2 * m * n * k / s
            cells.append(f"{rate / 1e9:8.0f} ({rate / peak[ceil[key]]:5.1%} {ceil[key]})")
        print(f"{f'{m} x {n} x {k}':>20} " + " ".join(f"{c:>22}" for c in cells), flush=True)
    for t in (int(v) for v in args.expert_tokens.split(",")):
        expert_layer(lib, pool, tiles, peak, ceil, t, args.rounds, g)
    pool.close()


if __name__ == "__main__":
    main()
