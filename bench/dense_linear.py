"""Dense linear layers on the CPU: FreeToken's kernels vs torch, side by side (outside CI).

    .venv/bin/python bench/dense_linear.py [--threads 2] [--tokens 1,4,8,16,32,64,512]

Shapes of the medium Qwen3-MoE's qkv projection (5120 x 2048) and lm_head (8192 x 2048).
Every call uses the next of several copies of the weight (> 300 MB in all), so weights come
from DRAM as in a real decode step, not from the last-level cache.
For each number of tokens M it prints ms per call of
  torch fp32   F.linear on an fp32 copy of the weight (what compute_dtype="auto" used to run)
  torch bf16   F.linear in bf16
  ours bf16    freetoken Linear over the bf16 weight (GEMV up to GEMV_TOKENS, else dequant + GEMM)
  ours int8    the same over int8 weights (dense_format="int8")
  gemv bf16    our GEMV forced at every M (to place the GEMV / GEMM crossover)
and the speedups ours/torch fp32."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from freetoken.kernels.pool import shared_pool  # noqa: E402
from freetoken.layers.linear import Linear  # noqa: E402


def median_ms(fns, min_s=0.3, min_iters=8):
    """Median ms per call, cycling through `fns` (one per weight copy)."""
    fns[0]()
    times, t_end, n = [], time.perf_counter() + min_s, 0
    while n < min_iters or time.perf_counter() < t_end:
        fn = fns[n % len(fns)]
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        n += 1
    return sorted(times)[len(times) // 2] * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", default="1,4,8,16,32,64,128,512")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pool = shared_pool(args.threads)
    for name, (n, k) in {"qkv 5120x2048": (5120, 2048), "lm_head 8192x2048": (8192, 2048)}.items():
        copies = max(2, (300 << 20) // (n * k * 2))
        ws = [torch.randn(n, k).to(torch.bfloat16) for _ in range(copies)]
        w32 = [w.float() for w in ws]
        ours = [Linear(w, compute_dtype=torch.float32, pool=pool) for w in ws]
        ours8 = [Linear(w, compute_dtype=torch.float32, fmt="int8", pool=pool) for w in ws]
        print(f"\n{name}: weight {ws[0].nbytes / 2**20:.0f} MiB bf16 x {copies} copies "
              f"(median ms per call, {args.threads} threads)")
        print(f"{'M':>4} {'torch fp32':>10} {'torch bf16':>10} {'ours bf16':>9} {'ours int8':>9} {'gemv bf16':>9}"
              f" {'bf16/fp32':>9} {'int8/fp32':>9}")
        for m in map(int, args.tokens.split(",")):
            x = torch.randn(m, k)
            xb = x.to(torch.bfloat16)
            t32 = median_ms([lambda w=w: F.linear(x, w) for w in w32])
            tbf = median_ms([lambda w=w: F.linear(xb, w) for w in ws]) if m <= 64 else float("nan")
            to = median_ms([lambda o=o: o(x) for o in ours])
            to8 = median_ms([lambda o=o: o(x) for o in ours8])
            tg = median_ms([lambda o=o: o._gemv(x) for o in ours]) if m <= 128 else float("nan")
            print(f"{m:>4} {t32:>10.3f} {tbf:>10.3f} {to:>9.3f} {to8:>9.3f} {tg:>9.3f} {t32 / to:>8.2f}x {t32 / to8:>8.2f}x")

if __name__ == "__main__":
    main()
