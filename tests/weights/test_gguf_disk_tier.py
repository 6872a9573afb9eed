"""GGUF files (llama.cpp's converter; ggml types, mixed Q4_K_M types) under the disk tier:
bit for bit the RAM-loaded GGUF's numbers (tests/experts/test_disk_tier.py does the rest)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experts"))
from test_disk_tier import assert_disk_tier_matches  # noqa: E402

GGUF_CASES = [("qwen3_moe", "f32"), ("qwen3_moe", "q8_0"), ("qwen3_moe", "q4_k_m"), ("mixtral", "q8_0"),
              ("deepseek_v3", "q8_0"), ("gpt_oss", "q8_0"), ("qwen3_5_moe", "q8_0")]


@pytest.mark.parametrize("arch,kind", GGUF_CASES, ids=[f"{a}-{k}" for a, k in GGUF_CASES])
def test_gguf_disk_tier_identical(tiny_dir, to_gguf, tmp_path, arch, kind):
    from gguf_rewrite import q4_k_m, rewrite
    args = ("--no-mtp",) if arch == "qwen3_5_moe" else ()
    d = tiny_dir(arch, **({"scoring_func": "sigmoid"} if arch == "deepseek_v3" else {}))
    if kind == "q4_k_m":         # mixed expert types per layer (Q6_K ffn_down every other layer)
        g = rewrite(to_gguf(d, "f32", *args), tmp_path / "q4km.gguf", q4_k_m)
    else:
        g = to_gguf(d, kind, *args)
    assert_disk_tier_matches(g, dtype="float32")


def test_gguf_in_ftw_disk_tier_identical(tiny_dir, to_gguf, tmp_path):
    """The FTW file converted from a GGUF (mixed Q4_K_M types) under the disk tier: the
    experts are read from the FTW file at the GGUF tensors' new offsets."""
    from gguf_rewrite import q4_k_m, rewrite

    from freetoken.loading.convert import convert
    g = rewrite(to_gguf(tiny_dir("qwen3_moe"), "f32"), tmp_path / "q4km.gguf", q4_k_m)
    convert(g, tmp_path / "q4km.ftw")
    assert_disk_tier_matches(tmp_path / "q4km.ftw", dtype="float32")
