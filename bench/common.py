"""Helpers shared by the benchmark scripts: cached medium checkpoints and timing."""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch

CACHE = Path(os.environ.get("FREETOKEN_BENCH_CACHE", Path.home() / ".cache" / "freetoken" / "bench"))

# Realistic per-layer shapes of a Qwen3-30B-A3B-class model, fewer layers so it fits the machine.
MEDIUM_QWEN3 = dict(layers=5, experts=64, top_k=8, hidden=2048, vocab=8192,
                    moe_intermediate_size=768, intermediate_size=6144, num_attention_heads=32,
                    num_key_value_heads=4, head_dim=128, max_position_embeddings=4096)


def medium_checkpoint(arch: str = "qwen3_moe", name: str = "qwen3-moe-medium", **shape) -> Path:
    from freetoken.tiny import make_tiny
    shape = shape or dict(MEDIUM_QWEN3)
    out = CACHE / name
    if not (out / "config.json").exists():
        print(f"building {out} (random weights, bf16) ...", flush=True)
        make_tiny(arch, out, dtype="bfloat16", initializer_range=0.1, **shape)
    return out


def timed(fn, *args, **kw):
    t = time.perf_counter()
    r = fn(*args, **kw)
    return time.perf_counter() - t, r


def set_threads(n: int) -> None:
    torch.set_num_threads(n)
