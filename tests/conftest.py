"""Shared fixtures: tiny random checkpoints written by transformers' own classes."""
from __future__ import annotations

from pathlib import Path

import pytest

from freetoken.tiny import make_tiny



@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """tiny_dir(arch, **make_tiny kwargs) -> a cached checkpoint directory."""
    root = tmp_path_factory.mktemp("tiny")
    cache: dict = {}

    def get(arch: str = "qwen3_moe", **kw) -> Path:
        key = (arch, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = make_tiny(arch, root / f"{arch}-{len(cache)}", **kw)
        return cache[key]

    return get
