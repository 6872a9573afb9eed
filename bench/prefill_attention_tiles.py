"""Causal prefill attention alone, as a share of this core's bf16 peak: the library's kernel
(kernels/c/prefill_attention.c, on AMX tiles or with vdpbf16ps) vs torch's CPU flash kernel in bf16
(outside CI).

    PYTHONPATH=. .venv/bin/python bench/prefill_attention_tiles.py [--rounds 5] [--tokens 2048,4096]
        [--heads 32/4,16/4] [--head-dim 128] [--mode amx|vdpbf16ps]

One thread, the calling thread's CPU time (on a shared machine that approximates a dedicated
core). --mode: the kernel's mode (default: AMX where it runs, else vdpbf16ps). Each round runs,
alternating: a burst of the mode's instruction (kernels/c/peak.c: the peak of that moment; the
VM's AMX unit has slow spells), the tiles, torch. FLOPs of a causal prompt of n
tokens: 4 x heads x head_dim x n(n+1)/2 (scores and values). Medians of the rounds, and each
path's FLOP per cycle at the clock of a dependent-imul chain (kernels/c/peak.c)."""
from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import torch

from freetoken import kernels
from freetoken.kernels.choices import PREFILL_ATT_MODES
from freetoken.kernels.pool import CpuPool
from freetoken.kernels.roofline import PEAK_KINDS
from freetoken.layers.attention import prefill

CLK = time.thread_time


def timed(fn) -> float:
    t = CLK()
    fn()
    return CLK() - t


def peak_rate(lib, pool, kind) -> float:
    """One thread's FLOP/s of `kind` (amx_bf16 | bf16) over a ~20 ms burst (the best of 3)."""
    secs = (ctypes.c_double * 3)()
    macs = lib.ft_peak_bursts(pool.handle, PEAK_KINDS[kind], 1 << 16, 3, secs)
    return 2 * macs / min(secs)


def shape(lib, pool, hq, hkv, d, n, rounds, hz, kind):
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(1, h, n, d, generator=g).bfloat16() for h in (hq, hkv, hkv))
    flops = 4 * hq * d * n * (n + 1) / 2
    paths = {"tiles": lambda: prefill.tiles_chunk(pool, q, k, v, d ** -0.5),
             "torch": lambda: prefill.causal_chunk(q, k, v, d ** -0.5)}
    for f in paths.values():
        f()
    t = {name: [] for name in paths}
    peaks = []
    for _ in range(rounds):
        peaks.append(peak_rate(lib, pool, kind))
        for name, f in paths.items():
            t[name].append(timed(f))
    peak = statistics.median(peaks)
    cells = []
    for name, ts in t.items():
        rate = flops / statistics.median(ts)
        cells.append(f"{name} {statistics.median(ts) * 1e3:7.1f} ms {rate / 1e9:5.0f} GFLOP/s "
                     f"{rate / peak:5.1%} of peak {rate / hz:5.0f} FLOP/cycle")
    print(f"{hq}/{hkv} x {d}, {n:5d} tokens: peak {peak / 1e9:.0f} GFLOP/s ({peak / hz:.0f} FLOP/cycle); "
          + "; ".join(cells) + f"; tiles {statistics.median(t['torch']) / statistics.median(t['tiles']):.2f}x torch")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", default="2048,4096")
    ap.add_argument("--heads", default="32/4,16/4")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--mode", choices=("amx", "vdpbf16ps"), default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    lib = kernels.load("native")
    pool = CpuPool(lib, 1)
    modes = [args.mode] if args.mode else ["amx", "vdpbf16ps"]
    mode = next((m for m in modes if lib.ft_set_prefill_att(PREFILL_ATT_MODES[m])), None)
    if mode is None:
        raise SystemExit(f"{' / '.join(modes)} does not run here (AMX: amx_bf16 and the OS's grant; vdpbf16ps: avx512_bf16)")
    kind = "amx_bf16" if mode == "amx" else "bf16"
    print(f"kernel mode {mode}, peak of {kind}")
    hz = (ctypes.c_double * 1)()
    lib.ft_core_hz(pool.handle, 100_000, hz)
    print(f"one thread, clock {hz[0] / 1e9:.2f} GHz (dependent imul chain)")
    for heads in args.heads.split(","):
        hq, hkv = map(int, heads.split("/"))
        for n in map(int, args.tokens.split(",")):
            shape(lib, pool, hq, hkv, args.head_dim, n, args.rounds, hz[0], kind)


if __name__ == "__main__":
    main()
