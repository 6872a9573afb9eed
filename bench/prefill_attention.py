"""Prefill attention of one chunk at a long context: the masked SDPA path (gather to fp32 +
a [q, k] boolean mask) vs the blockwise path without a mask (fp32, and bf16 over the bf16 KV
cache as `compute_dtype="auto"` picks where native bf16 GEMM is faster), side by side.

    PYTHONPATH=. .venv/bin/python bench/prefill_attention.py [--threads 2] [--contexts 4096,16384] [--chunk 2048]
    PYTHONPATH=. .venv/bin/python bench/prefill_attention.py --per-token 16384   # CPU time, 1 thread

--per-token N: the attention's CPU time per prompt token (blockwise bf16) for a 512-token prompt
and, interpolated from the first and last 2048-token chunks (the cost is affine in the context),
averaged over an N-token prompt: what a long prompt adds per token, free of the load's time slicing.

Shapes of the medium Qwen3-MoE (32 query heads, 4 KV heads, head_dim 128), one layer, bf16 KV."""
from __future__ import annotations

import argparse
import time

import torch

from freetoken.layers.attention.paged import AttentionMetadata, KVCache, paged_attention


def setup(ctx: int, chunk: int, hq=32, hkv=4, d=128):
    g = torch.Generator().manual_seed(ctx)
    cache = KVCache(ctx + 16, hkv, d, torch.bfloat16, "cpu")
    cache.k.copy_(torch.randn(cache.k.shape, generator=g))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    slots = (torch.arange(ctx) + 16)[None]
    qpos = torch.arange(ctx - chunk, ctx)[None]
    meta = AttentionMetadata(slot_mapping=slots[0, ctx - chunk:], key_slots=slots, key_positions=torch.arange(ctx)[None],
                             query_index=torch.arange(chunk)[None], query_positions=qpos, num_tokens=chunk,
                             context_lens=torch.tensor([ctx]))
    q = torch.randn(chunk, hq, d, generator=g)
    k, v = torch.randn(chunk, hkv, d, generator=g), torch.randn(chunk, hkv, d, generator=g)
    return q, k, v, cache, meta


def best(fn, reps=2):
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


def cpu_seconds(ctx: int, chunk: int) -> float:
    q, k, v, cache, meta = setup(ctx, chunk)
    paged_attention(q, k, v, cache, meta, 128 ** -0.5, prefill_dtype=torch.bfloat16)
    t = time.process_time()
    paged_attention(q, k, v, cache, meta, 128 ** -0.5, prefill_dtype=torch.bfloat16)
    return time.process_time() - t


def per_token(n: int, chunk: int):
    torch.set_num_threads(1)
    short = cpu_seconds(512, 512) / 512
    first, last = cpu_seconds(chunk, chunk), cpu_seconds(n, chunk)
    ends = range(chunk, n + 1, chunk)
    avg = sum(first + (last - first) * (e - chunk) / max(n - chunk, 1) for e in ends) / n
    print(f"attention CPU ms per prompt token, one layer, 1 thread: 512-token prompt {short * 1e3:.3f}; "
          f"{chunk}-token chunks ending at {chunk} / {n}: {first / chunk * 1e3:.3f} / {last / chunk * 1e3:.3f}; "
          f"{n}-token prompt average {avg * 1e3:.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--contexts", default="4096,16384")
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--per-token", type=int, default=0, help="prompt length for the CPU-time-per-token mode")
    args = ap.parse_args()
    if args.per_token:
        return per_token(args.per_token, args.chunk)
    torch.set_num_threads(args.threads)
    print(f"{'context':>8}{'chunk':>7}{'masked fp32 s':>15}{'blockwise fp32 s':>18}{'blockwise bf16 s':>18}"
          f"{'fp32 speed-up':>15}{'bf16 speed-up':>15}")
    for ctx in map(int, args.contexts.split(",")):
        q, k, v, cache, meta = setup(ctx, args.chunk)
        scale = 128 ** -0.5
        masked = AttentionMetadata(**{**meta.__dict__, "context_lens": None, "masks": {}})
        t_mask = best(lambda: paged_attention(q, k, v, cache, masked, scale))
        t_f32 = best(lambda: paged_attention(q, k, v, cache, meta, scale))
        t_b16 = best(lambda: paged_attention(q, k, v, cache, meta, scale, prefill_dtype=torch.bfloat16))
        print(f"{ctx:8}{args.chunk:7}{t_mask:15.3f}{t_f32:18.3f}{t_b16:18.3f}{t_mask / t_f32:14.2f}x"
              f"{t_mask / t_b16:14.2f}x", flush=True)


if __name__ == "__main__":
    main()
