"""NVIDIA ModelOpt NVFP4 checkpoints (`quantization_config.quant_algo: NVFP4`): each quantized
linear `X.weight` is uint8 [out, in/2] (two e2m1 per byte) with `X.weight_scale` float8_e4m3fn
[out, in/16], `X.weight_scale_2` (float32 scalar, the dequantization multiplier) and
`X.input_scale` (activation scale for FP4 tensor cores; unused on the CPU).

Routed experts stay packed in the expert banks (`experts/formats.py`, "nvfp4"); every other
quantized linear is dequantized once at load by `Checkpoint.get_float`."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import CheckpointError
from ..quant.nvfp4 import dequantize_nvfp4, from_checkpoint, quantize_nvfp4


def is_nvfp4(ck, name: str) -> bool:
    return name.endswith(".weight") and ck.has(f"{name}_scale") and ck.has(f"{name}_scale_2")


def read_nvfp4(ck, name: str, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(blocks [out, in/16, 8], e4m3 scale bytes [out, in/16], global [out]) of linear `name` [out, in]."""
    out, inp = shape
    w = ck.get(name)
    if w.dtype != torch.uint8 or tuple(w.shape) != (out, inp // 2):
        raise CheckpointError(f"{ck.dir}: NVFP4 tensor {name!r} is {w.dtype} {tuple(w.shape)}, "
                              f"expected uint8 {(out, inp // 2)}")
    s = ck.get(f"{name}_scale")
    if tuple(s.shape) != (out, inp // 16) or s.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise CheckpointError(f"{ck.dir}: NVFP4 tensor {name}_scale is {s.dtype} {tuple(s.shape)}, "
                              f"expected float8_e4m3fn {(out, inp // 16)}")
    return from_checkpoint(w, s.view(torch.float8_e4m3fn), ck.get(f"{name}_scale_2").float())


def dequantize(ck, name: str, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    blocks, scales, glob = read_nvfp4(ck, name, shape)
    return dequantize_nvfp4(blocks, scales, glob, dtype).reshape(shape)


def quantize_checkpoint(model_dir: str | Path, select) -> None:
    """Rewrite the float linears `select(name)` picks in a checkpoint as ModelOpt NVFP4 (used by
    make-tiny and the tests; the float originals are gone afterwards)."""
    from safetensors.torch import load_file, save_file

    d = Path(model_dir)
    index = d / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"] if index.is_file() else None
    for f in sorted(d.glob("*.safetensors")):
        out = {}
        for name, t in load_file(str(f)).items():
            if not (name.endswith(".weight") and t.dim() == 2 and t.shape[1] % 16 == 0 and select(name)):
                out[name] = t
                continue
            blocks, scales, glob = quantize_nvfp4(t.float())
            out[name] = blocks.reshape(t.shape[0], t.shape[1] // 2)
            out[f"{name}_scale"] = scales.view(torch.float8_e4m3fn)
            out[f"{name}_scale_2"] = glob[0].reshape(())
            out[name[:-len("weight")] + "input_scale"] = torch.ones(())
            if weight_map is not None:
                for k in (f"{name}_scale", f"{name}_scale_2", name[:-len("weight")] + "input_scale"):
                    weight_map[k] = f.name
        save_file(out, str(f), metadata={"format": "pt"})
    if weight_map is not None:
        data = json.loads(index.read_text())
        data["weight_map"] = weight_map
        index.write_text(json.dumps(data, indent=2))
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                  "exclude_modules": ["lm_head"]}
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
