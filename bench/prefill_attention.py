"""Prefill attention of one chunk at a long context: the masked SDPA path (gather to fp32 +
a [q, k] boolean mask) vs the blockwise path without a mask (fp32, and bf16 over the bf16 KV
cache as `compute_dtype="auto"` picks where native bf16 GEMM is faster), side by side.

    PYTHONPATH=. .venv/bin/python bench/prefill_attention.py [--threads 2] [--contexts 4096,16384] [--chunk 2048]

Shapes of the medium Qwen3-MoE (32 query heads, 4 KV heads, head_dim 128), one layer, bf16 KV."""
from __future__ import annotations

import argparse
import time

import torch

from freetoken.layers.attention import AttentionMetadata, KVCache, paged_attention


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--contexts", default="4096,16384")
    ap.add_argument("--chunk", type=int, default=2048)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{'context':>8}{'chunk':>7}{'masked fp32 s':>15}{'blockwise fp32 s':>18}{'blockwise bf16 s':>18}"
          f"{'fp32 speed-up':>15}{'bf16 speed-up':>15}")
    for ctx in map(int, args.contexts.split(",")):
        q, k, v, cache, meta = setup(ctx, args.chunk)
        scale = 128 ** -0.5
        masked = AttentionMetadata(**{**meta.__dict__, "context_lens": None, "_masks": {}})
        t_mask = best(lambda: paged_attention(q, k, v, cache, masked, scale))
        t_f32 = best(lambda: paged_attention(q, k, v, cache, meta, scale))
        t_b16 = best(lambda: paged_attention(q, k, v, cache, meta, scale, prefill_dtype=torch.bfloat16))
        print(f"{ctx:8}{args.chunk:7}{t_mask:15.3f}{t_f32:18.3f}{t_b16:18.3f}{t_mask / t_f32:14.2f}x"
              f"{t_mask / t_b16:14.2f}x", flush=True)


if __name__ == "__main__":
    main()
