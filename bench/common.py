"""Helpers shared by the benchmark scripts: cached medium checkpoints and timing."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import torch

# ../shared/data beside the checkout (a worktree one level deeper finds it one more level up)
SHARED_DATA = next((p / "shared" / "data" for p in Path(__file__).resolve().parents[1:4]
                    if (p / "shared" / "data").is_dir()), Path(__file__).resolve().parents[1].parent / "shared" / "data")
CACHE = Path(os.environ.get("FREETOKEN_BENCH_CACHE", Path.home() / ".cache" / "freetoken" / "bench"))

# Realistic per-layer shapes of a Qwen3-30B-A3B-class model, fewer layers so it fits the machine.
MEDIUM_QWEN3 = dict(layers=5, experts=64, top_k=8, hidden=2048, vocab=8192,
                    moe_intermediate_size=768, intermediate_size=6144, num_attention_heads=32,
                    num_key_value_heads=4, head_dim=128, max_position_embeddings=65536)

# The second medium shape (issue 38): fewer experts per layer (48, top-8), 16 query heads, a small
# vocabulary -- what a shape that is not the bench's own pays for.
MEDIUM_QWEN3_48 = dict(layers=6, experts=48, top_k=8, hidden=2048, vocab=3000,
                       moe_intermediate_size=768, intermediate_size=6144, num_attention_heads=16,
                       num_key_value_heads=4, head_dim=128, max_position_embeddings=65536)

# gpt-oss-20b per-layer shapes (hidden/intermediate 2880, 64 heads x 64, 8 kv heads, window 128 on
# alternate layers, sinks, 32 MXFP4 experts top-4), 4 of its 24 layers: ~2 GB on disk. YaRN as
# gpt-oss ships it except `truncate`: llama.cpp always rounds the YaRN correction dims
# (ggml_rope_yarn_corr_dims), so truncate=True makes both engines compute the same function.
MEDIUM_GPT_OSS = dict(layers=4, experts=32, top_k=4, hidden=2880, vocab=8192, intermediate_size=2880,
                      num_attention_heads=64, num_key_value_heads=8, head_dim=64, sliding_window=128,
                      max_position_embeddings=32768,     # room for the 16k-token benches (YaRN: factor 32 over 4096)
                      rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0,
                                           beta_slow=1.0, original_max_position_embeddings=4096, truncate=True))


def medium_checkpoint(arch: str = "qwen3_moe", name: str = "qwen3-moe-medium", initializer_range: float = 0.1,
                      **shape) -> Path:
    from freetoken.tiny import make_tiny
    shape = shape or dict(MEDIUM_QWEN3)
    out = CACHE / name
    if not (out / "config.json").exists():
        print(f"building {out} (random weights, bf16) ...", flush=True)
        tmp = out.with_name(out.name + ".partial")      # renamed when complete: a killed build is not a cache hit
        shutil.rmtree(tmp, ignore_errors=True)
        prev = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)     # init in bf16: a float32 copy of the larger ones overflows RAM
        try:
            make_tiny(arch, tmp, dtype="bfloat16", initializer_range=initializer_range, **shape)
        finally:
            torch.set_default_dtype(prev)
        tmp.rename(out)
    _ensure_positions(out, shape.get("max_position_embeddings"))
    return out


def _ensure_positions(out: Path, n: int | None) -> None:
    """A checkpoint cached before the long-context benches (4096 positions) gets its position
    limit raised: the weights do not depend on it."""
    import json
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if n and cfg.get("max_position_embeddings", n) < n:
        cfg["max_position_embeddings"] = n
        cfg_path.write_text(json.dumps(cfg, indent=2))


def medium_gpt_oss() -> Path:
    """initializer_range 0.02 (gpt-oss's own): at 0.1 the 2880-wide layers saturate the clamped
    SwiGLU and make attention one-hot, so bf16 rounding alone flips most greedy tokens between
    any two engines (transformers included) and a cross-engine check says nothing."""
    return medium_checkpoint("gpt_oss_mxfp4", "gpt-oss-medium", initializer_range=0.02, **MEDIUM_GPT_OSS)


def timed(fn, *args, **kw):
    t = time.perf_counter()
    r = fn(*args, **kw)
    return time.perf_counter() - t, r


def set_threads(n: int) -> None:
    torch.set_num_threads(n)


def fresh_prompts(n: int, length: int, seed: int = 0, vocab: tuple[int, int] = (100, 8000)) -> list[list[int]]:
    """`n` random prompts of `length` tokens whose first tokens all differ, so no prompt shares a
    prefix with another (a prefix-cache hit or a reused warm-up cannot shorten a timed prefill)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = torch.randint(*vocab, (length,), generator=g).tolist()
        p[0] = vocab[0] + i              # distinct first tokens: no common prefix at all
        out.append(p)
    return out


def last_level_cache_bytes() -> int:
    """This CPU's largest cache (Linux sysfs; 0 where it says nothing)."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        t = f.read_text().strip()
        sizes.append(int(t[:-1]) * {"K": 1 << 10, "M": 1 << 20}[t[-1]] if t[-1] in "KM" else int(t))
    return max(sizes, default=0)


def experts_past_cache(hidden: int, inter: int, bytes_per_weight: float = 0.5, least: int = 32) -> int:
    """Experts a decode bench's bank needs to be twice the last-level cache at `bytes_per_weight`
    (0.5: the 4-bit formats; the wider ones are larger still): a bank the cache holds measures the
    cache, not memory (32 Q4_K experts of 2048 x 768 are 90 MB; this machine's L3 holds 300 MiB)."""
    return max(least, -(-2 * last_level_cache_bytes() // int(3 * hidden * inter * bytes_per_weight)))


def median(xs) -> float:
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2
