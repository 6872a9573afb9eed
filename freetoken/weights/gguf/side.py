"""The side files a model directory carries (tokenizer.json, tokenizer_config.json with the
chat template, generation_config.json), made from a GGUF file's `tokenizer.*` metadata so
that one .gguf file is a complete model."""
from __future__ import annotations

import functools
import json
from pathlib import Path

from .tokenizer import load_gguf_tokenizer


@functools.lru_cache(maxsize=4)
def _tokenizer(path: Path, mtime: float):
    return load_gguf_tokenizer(path)


def side_tokenizer(path: str | Path):
    """The `tokenizers.Tokenizer` that tokenizer.json (`side_file`) serializes, as built."""
    p = Path(path)
    return _tokenizer(p, p.stat().st_mtime)[0]


def side_file(path: str | Path, name: str) -> str | None:
    p = Path(path)
    if name not in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        return None
    tok, config = _tokenizer(p, p.stat().st_mtime)
    if name == "tokenizer.json":
        return tok.to_str()
    if name == "tokenizer_config.json":
        return json.dumps(config, ensure_ascii=False)
    eos = tok.token_to_id(config["eos_token"]) if config.get("eos_token") else None
    return json.dumps({"eos_token_id": eos} if eos is not None else {})
