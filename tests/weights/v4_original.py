"""A make-tiny DeepSeek-V4 checkpoint (transformers' names) rewritten in the layout DeepSeek ships
V4-Flash in and llama.cpp's converter reads: no `model.` prefix, `embed`/`head`, `hc_head_*`,
`attn.kv_norm`, FP8/FP4 scales as `.scale`, and the config's `compress_ratios` per layer and
`num_hash_layers`."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

RENAMES = (("model.embed_tokens.", "embed."), ("model.hc_head.hc_", "hc_head_"), ("model.", ""),
           (".attn.norm.", ".attn.kv_norm."), (".weight_scale_inv", ".scale"))


def original_name(name: str) -> str:
    for old, new in RENAMES:
        name = name.replace(old, new)
    return name


def to_original(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for f in dst.glob("*.safetensors"):
        save_file({original_name(k): v for k, v in load_file(str(f)).items()}, str(f), metadata={"format": "pt"})
    index = dst / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        data["weight_map"] = {original_name(k): v for k, v in data["weight_map"].items()}
        index.write_text(json.dumps(data))
    cfg = json.loads((dst / "config.json").read_text())
    rates = cfg.get("compress_rates") or {}
    cfg["compress_ratios"] = [int(rates.get(t, 0)) for t in cfg["layer_types"]]
    cfg["num_hash_layers"] = sum(t == "hash_moe" for t in cfg["mlp_layer_types"])
    (dst / "config.json").write_text(json.dumps(cfg, indent=1))
    return dst
