"""Range and type checks on what a model file declares, before anything is sized from it:
a config that says 10^9 layers, 0 heads or 10^12 experts, a non-finite epsilon, a config
nested 100k deep, a GGUF alignment of 0, an FTW header claiming 2^62 bytes. Each check is
one line naming the file and the field (CheckpointError, exit 2 from the CLI)."""
from __future__ import annotations

import math
import os
import stat
from pathlib import Path

from ..errors import CheckpointError

MAX_CONFIG_DEPTH = 32
MAX_HEADER_BYTES = 1 << 30          # an FTW header (tensor table + side files) of 1 GiB is plenty

# field -> (smallest, largest) accepted; the largest are far above any released model
INT_RANGES = {
    "num_hidden_layers": (1, 1024), "num_layers": (1, 1024), "n_layer": (1, 1024),
    "num_attention_heads": (1, 1024), "num_key_value_heads": (1, 1024), "n_head": (1, 1024),
    "hidden_size": (1, 1 << 17), "intermediate_size": (1, 1 << 20),
    "moe_intermediate_size": (1, 1 << 20), "shared_expert_intermediate_size": (0, 1 << 20),
    "head_dim": (0, 1 << 13), "kv_lora_rank": (0, 1 << 14), "q_lora_rank": (0, 1 << 14),
    "qk_nope_head_dim": (0, 1 << 13), "qk_rope_head_dim": (0, 1 << 13), "v_head_dim": (0, 1 << 13),
    "num_experts": (0, 1 << 14), "num_local_experts": (0, 1 << 14), "n_routed_experts": (0, 1 << 14),
    "n_shared_experts": (0, 1 << 10), "num_experts_per_tok": (1, 1 << 10), "moe_topk": (1, 1 << 10),
    "n_group": (1, 1 << 10), "topk_group": (1, 1 << 10), "first_k_dense_replace": (0, 1024),
    "vocab_size": (1, 1 << 24), "max_position_embeddings": (1, 1 << 26),
    "sliding_window": (0, 1 << 26), "moe_layer_freq": (0, 1024), "decoder_sparse_step": (0, 1024),
}
POSITIVE_FLOATS = {"rope_theta", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon",
                   "norm_eps", "routed_scaling_factor"}
EPS_FIELDS = {"rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps"}


def check_depth(obj, where, limit: int = MAX_CONFIG_DEPTH) -> None:
    stack = [(obj, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            if d > limit:
                raise CheckpointError(f"{where}: nested more than {limit} levels deep")
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))


# fields the model code reads as an object / a list (null: absent)
SHAPED_FIELDS = {"rope_parameters": dict, "rope_scaling": dict, "quantization_config": dict,
                 "compress_rates": dict, "layer_types": list, "mlp_layer_types": list,
                 "mlp_only_layers": list, "indexer_types": list}


def check_config(cfg: dict, where) -> None:
    """The size fields of a config (top level and text_config), before a model is built."""
    check_depth(cfg, where)
    for scope, data in (("", cfg), ("text_config.", cfg.get("text_config"))):
        if not isinstance(data, dict):
            continue
        for name, (lo, hi) in INT_RANGES.items():
            v = data.get(name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int):
                if isinstance(v, float) and v.is_integer() and lo <= v <= hi:
                    continue      # 64.0: the model code decides whether it takes it
                raise CheckpointError(f"{where}: field {scope}{name!r} is {_show(v)}, expected "
                                      f"int in [{lo}, {hi}]")
            if not lo <= v <= hi:
                raise CheckpointError(f"{where}: field {scope}{name!r} is {_show(v)}, expected "
                                      f"int in [{lo}, {hi}]")
        for name, kind in SHAPED_FIELDS.items():
            v = data.get(name)
            if v is not None and not isinstance(v, kind):
                raise CheckpointError(f"{where}: field {scope}{name!r} is {_show(v)}, expected "
                                      f"{'an object' if kind is dict else 'a list'} or null")
        for name in POSITIVE_FLOATS:
            v = data.get(name)
            if v is None:
                continue
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
            if ok and name in EPS_FIELDS:
                ok = v < 1
            if not ok:
                want = "a number in (0, 1)" if name in EPS_FIELDS else "a finite number > 0"
                raise CheckpointError(f"{where}: field {scope}{name!r} is {_show(v)}, expected {want}")


def _show(v) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def check_regular_file(path: Path, what: str = "file") -> None:
    """A FIFO, socket or device named like a weights file would block or never end a read."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{path}: not a regular file (a {what} must be one)")


def check_gguf_alignment(path, align) -> int:
    if isinstance(align, bool) or not isinstance(align, int) or not 1 <= align <= 1 << 20 or align & (align - 1):
        raise CheckpointError(f"{path}: field 'general.alignment' is {_show(align)}, expected a "
                              "power of two in [1, 2^20]")
    return align


def check_header_size(path, size: int, file_size: int) -> None:
    if not 0 < size <= min(MAX_HEADER_BYTES, file_size):
        raise CheckpointError(f"{path}: FTW header size {size} bytes is impossible (the file has "
                              f"{file_size}, a header at most {MAX_HEADER_BYTES})")
