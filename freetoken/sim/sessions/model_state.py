"""What a model's config says about its caches, without loading weights: the bytes of one
state snapshot (gated-DeltaNet conv + recurrent state, sliding-window K/V) and of one token
of paged KV. Mirrors the shapes `make_state()` and `kv_layers()` of the model classes build."""
from __future__ import annotations

import json
from pathlib import Path

from ...errors import CheckpointError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def text_config(model_dir: str | Path) -> dict:
    path = Path(model_dir) / "config.json"
    try:
        data = json.loads(path.read_text())
    except OSError:
        raise CheckpointError(f"{path}: missing config.json") from None
    except ValueError as e:
        raise CheckpointError(f"{path}: not JSON ({e})") from None
    return {**data, **data.get("text_config", {})}


def _layer_types(c: dict) -> list[str]:
    n = c.get("num_hidden_layers", 0)
    if c.get("layer_types"):
        return list(c["layer_types"])
    if "linear_num_value_heads" in c:
        k = c.get("full_attention_interval", 4)
        return ["full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(n)]
    return ["full_attention"] * n


def cache_shapes(model_dir: str | Path, dtype: str | None = None) -> dict:
    """{state_bytes, kv_bytes_per_token, kind} for the model in model_dir."""
    c = text_config(model_dir)
    width = DTYPE_BYTES.get(dtype or c.get("dtype") or c.get("torch_dtype") or "bfloat16", 2)
    types = _layer_types(c)
    heads = c.get("num_attention_heads", 1)
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or c.get("hidden_size", 0) // max(1, heads)
    linear = types.count("linear_attention")
    window = types.count("sliding_attention") if c.get("sliding_window") else 0
    state = 0
    if linear:
        hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
        conv = (2 * hk * dk + hv * dv) * (c.get("linear_conv_kernel_dim", 4) - 1) * width
        state += linear * (conv + hv * dk * dv * 4)             # recurrent state is fp32
    if window:
        state += window * 2 * c["sliding_window"] * kv_heads * head_dim * width
    full = len(types) - linear - window
    return {"state_bytes": state, "kv_bytes_per_token": 2 * full * kv_heads * head_dim * width,
            "kind": "hybrid" if state else "full attention"}
