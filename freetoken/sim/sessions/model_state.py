"""What a model's config says about its caches, without loading weights: the bytes of one
state snapshot (gated-DeltaNet conv + recurrent state, sliding-window K/V, a compressor's
buffers) and of one token of paged KV -- asked of the model class itself
(`models/cache_spec.py`), so the simulator sizes what the engine allocates."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ...errors import CheckpointError
from ...models.cache_spec import cache_spec_for

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def read_config(model_dir: str | Path) -> dict:
    path = Path(model_dir) / "config.json"
    try:
        return json.loads(path.read_text())
    except OSError:
        raise CheckpointError(f"{path}: missing config.json") from None
    except ValueError as e:
        raise CheckpointError(f"{path}: not JSON ({e})") from None


def cache_shapes(model_dir: str | Path, dtype: str | None = None) -> dict:
    """{state_bytes, kv_bytes_per_token, kind} for the model in model_dir on this CPU. A
    DeepSeek-V4 snapshot holds the compressed entries made so far on top of the state counted
    here (window ring and compressor buffers)."""
    c = read_config(model_dir)
    text = c.get("text_config") if isinstance(c.get("text_config"), dict) else c
    name = dtype or text.get("dtype") or text.get("torch_dtype") or c.get("torch_dtype") or "bfloat16"
    spec = cache_spec_for(c, Path(model_dir) / "config.json", 1, DTYPES.get(name, torch.bfloat16), torch.device("cpu"))
    return {"state_bytes": spec.state_bytes, "kv_bytes_per_token": spec.kv_bytes_per_token, "kind": spec.kind}
