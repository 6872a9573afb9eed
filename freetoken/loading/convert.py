"""`freetoken convert`: an HF checkpoint directory or a GGUF file -> one FTW file (format in
weights/ftw/format.py).

From an HF directory the model is built once on the CPU exactly as the engine builds it,
through a checkpoint that records what the model reads: the expert pool it builds (already
re-encoded to `expert_format`) is written bank by bank in its runtime layout, every other
tensor it read or asked about is written unchanged, so loading the FTW file rebuilds the same
model. A GGUF is not built at all: its tensors are streamed into the file as they are
(weights/ftw/from_gguf.py), its tokenizer metadata becomes the tokenizer side files."""
from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

import torch

from ..config import EngineConfig
from ..kernels.switch_set import loading
from ..weights.checkpoint import Checkpoint
from ..weights.ftw import format as ftw_format
from ..weights.ftw.from_gguf import convert_gguf
from ..weights.ftw.writer import RecordingCheckpoint, default_dtype, side_files, write_tensors
from ..weights.gguf.reader import is_gguf
from .loader import build_model, expert_pool


def convert(model_dir: str | os.PathLike, out: str | os.PathLike, expert_format: str | None = None,
            dtype: str | None = None, num_threads: int | None = None) -> dict:
    """Writes `out` and returns its header."""
    src, out = Path(model_dir), Path(out)
    if is_gguf(src):
        return convert_gguf(src, out, expert_format)
    ck = Checkpoint(src)
    dtype = dtype or default_dtype(ck.config)
    cfg = EngineConfig(model=str(src), dtype=dtype, device="cpu", moe_backend="cpu",
                       expert_format=expert_format, num_threads=num_threads)
    rec = RecordingCheckpoint(ck)
    max_pos = int(ck.config.get("max_position_embeddings") or 4096)
    with loading():     # the build's kernel choices apply while it runs, the caller's after
        model = build_model(rec, cfg, min(max_pos, 4096))       # its tensors only: no experts backend
        pool = expert_pool(model, cfg) if model.experts is not None else None

    items: list[tuple[str, str, torch.Tensor]] = []
    for name, data in side_files(src):
        items.append((name, "file", torch.frombuffer(bytearray(data), dtype=torch.uint8) if data
                      else torch.empty(0, dtype=torch.uint8)))
    for name in rec.dense:
        items.append((name, "dense", ck.get(name)))
    experts = None
    if pool is not None:
        experts = {"num_layers": pool.num_layers, "num_experts": pool.num_experts, "spec": asdict(pool.spec)}
        items += [(name, "bank", bank) for name, bank in pool.banks.items()]

    header = {"format_version": ftw_format.VERSION, "config": ck.config,
              "config_hash": ftw_format.config_hash(ck.config),
              "source": src.resolve().name, "options": {"dtype": dtype, "expert_format": expert_format},
              "experts": experts, "chunk_bytes": ftw_format.CHUNK_BYTES, "tensors": []}
    write_tensors(out, header, items)
    ck.close()
    return header
