"""A model source is an HF checkpoint directory, an FTW file or a GGUF file: one door for all."""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import CheckpointError
from .checkpoint import Checkpoint, read_json
from .ftw.from_gguf import GgufInFtw, is_gguf_ftw
from .ftw.reader import FtwFile, is_ftw, read_header, read_side_file
from .gguf.reader import GgufFile, is_gguf
from .gguf.side import side_file, side_tokenizer


def open_checkpoint(path: str | os.PathLike, cfg=None):
    """A Checkpoint or FtwFile for `path`; an FTW file is checked against the engine options
    `cfg` (expert_format, dtype, verify_weights, num_threads) before its weights are read.
    An FTW file is read in the background (the model is built meanwhile): the caller's
    `close()` waits for the last bytes and checksums, `abandon()` stops the reading."""
    if not Path(path).is_file():
        return Checkpoint(path)
    if is_gguf(path):
        return GgufFile(path, cfg)
    header = read_header(Path(path))
    if is_gguf_ftw(header):          # a GGUF kept in an FTW file: read as the GGUF is
        return GgufInFtw(path, cfg, header, verify=getattr(cfg, "verify_weights", True) if cfg is not None else True)
    if cfg is not None:
        made = (header.get("options") or {}).get("expert_format")
        if cfg.expert_format and cfg.expert_format != made:
            raise CheckpointError(f"{path}: experts were converted to {made or 'the checkpoint format'}, "
                                  f"not {cfg.expert_format}; re-run `freetoken convert --expert-format "
                                  f"{cfg.expert_format}` or drop --expert-format")
    f = FtwFile(path, verify=getattr(cfg, "verify_weights", True) if cfg is not None else True, background=True,
                banks=not getattr(cfg, "disk_tier", False))
    if cfg is not None:
        f.float_experts_dtype = cfg.torch_dtype
    return f


def read_model_text(path: str | os.PathLike, name: str) -> str | None:
    """A side file (tokenizer.json, generation_config.json, ...) of a directory or FTW file."""
    p = Path(path)
    try:
        if p.is_dir():
            f = p / name
            return f.read_text(encoding="utf-8") if f.is_file() else None
        if is_ftw(p):
            data = read_side_file(p, name)
            return data.decode() if data is not None else None
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{p / name if p.is_dir() else f'{p}:{name}'}: not UTF-8 text ({e})") from None
    if is_gguf(p):
        return side_file(p, name)
    return None


def read_model_tokenizer(path: str | os.PathLike):
    """A GGUF file's tokenizer as a `tokenizers.Tokenizer`, built from its metadata once and
    shared (the object is not changed after it is built); None for other checkpoints, whose
    tokenizer.json `read_model_text` gives. Skips a JSON round trip that costs a 150k-token
    vocabulary ~0.3 s at start, holding the GIL while the weights are read."""
    p = Path(path)
    return side_tokenizer(p) if p.is_file() and not is_ftw(p) and is_gguf(p) else None


def model_config(path: str | os.PathLike) -> dict:
    """config.json of a directory, or the config inside an FTW file."""
    p = Path(path)
    if is_ftw(p):
        return read_header(p)["config"]
    if is_gguf(p):
        return GgufFile(p).config
    return read_json(p / "config.json", "config.json")


def load_json_side_file(path, name: str) -> dict | None:
    """A JSON side file as an object; None when absent; one-line error when malformed."""
    text = read_model_text(path, name)
    if text is None:
        return None
    where = Path(path) / name if Path(path).is_dir() else f"{path}:{name}"
    try:
        data = json.loads(text)
    except ValueError as e:
        raise CheckpointError(f"{where}: malformed JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{where}: expected a JSON object at top level")
    return data
