"""Reading Hugging Face checkpoints: config.json and safetensors (single file or sharded)."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch
from safetensors import safe_open

from ..errors import CheckpointError
from .validate import check_config, check_regular_file
from ..progress import progress
from ..quant.fp8 import block_scales, dequantize_fp8_block
from . import modelopt
from .pread import RangeReader


def read_json(path: Path, what: str) -> dict:
    if not path.exists():
        raise CheckpointError(f"{path}: missing {what}")
    check_regular_file(path, what)
    try:
        data = json.loads(path.read_text())
    except RecursionError:
        raise CheckpointError(f"{path}: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:      # ValueError: also a 5000-digit integer
        raise CheckpointError(f"{path}: malformed JSON ({str(e)[:200]})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object at top level")
    return data


_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


class _SafetensorsFile:
    """One safetensors file read with pread straight into each tensor's own buffer (safe_open
    maps the file, and every page a load touches stays resident until it is closed: a peak
    of twice the weights)."""

    def __init__(self, path: Path, on_bytes):
        import struct

        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            self.header = json.loads(f.read(n))
        self.base = 8 + n
        self.reader = RangeReader(path, on_bytes)

    def get(self, name: str) -> torch.Tensor | None:
        meta = self.header[name]
        dt = _ST_DTYPES.get(meta["dtype"])
        if dt is None:
            return None
        a, b = meta["data_offsets"]
        out = torch.empty(meta["shape"], dtype=dt)
        if out.nbytes != b - a:
            return None
        self.reader.tensor_into(out, self.base + a)
        return out

    def close(self):
        self.reader.close()


class Checkpoint:
    """Tensor names -> safetensors files; tensors are read lazily, one at a time."""

    def __init__(self, model_dir: str | Path):
        self.dir = Path(model_dir)
        if not self.dir.is_dir():
            raise CheckpointError(f"{self.dir}: model directory does not exist")
        self.config = read_json(self.dir / "config.json", "config.json")
        check_config(self.config, self.dir / "config.json")
        self.file_of: dict[str, Path] = {}
        index = self.dir / "model.safetensors.index.json"
        single = self.dir / "model.safetensors"
        if index.is_file():
            weight_map = read_json(index, "shard index").get("weight_map")
            if not isinstance(weight_map, dict):
                raise CheckpointError(f"{index}: field 'weight_map' missing or not an object")
            for name, shard in weight_map.items():
                path = self.dir / shard
                if not path.is_file():
                    raise CheckpointError(f"{path}: shard listed in {index.name} for tensor {name!r} is missing")
                self.file_of[name] = path
        elif single.exists():
            check_regular_file(single, "safetensors file")
            self._scan(single)
        else:
            files = sorted(self.dir.glob("*.safetensors"))
            for f in files:
                check_regular_file(f, "safetensors file")
            if not files:
                raise CheckpointError(f"{self.dir}: no model.safetensors, model.safetensors.index.json or *.safetensors")
            for f in files:
                self._scan(f)
        self._handles: dict[Path, object] = {}
        self._bar = None

    def _scan(self, path: Path):
        try:
            with safe_open(str(path), "pt") as f:
                for name in f.keys():
                    self.file_of[name] = path
        except Exception as e:  # safetensors raises several error types for bad headers
            raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None

    def names(self) -> list[str]:
        return list(self.file_of)

    def has(self, name: str) -> bool:
        return name in self.file_of

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """The tensor `name`, checked against `shape` (None entries match anything)."""
        path = self.file_of.get(name)
        if path is None:
            raise CheckpointError(f"{self.dir}: tensor {name!r} not found in the checkpoint")
        if self._bar is None:
            self._bar = progress(sum(p.stat().st_size for p in set(self.file_of.values())), f"load {self.dir.name}")
        handle = self._handles.get(path)
        if handle is None:
            handle = self._handles[path] = _SafetensorsFile(path, self._bar.update)
        t = handle.get(name)
        if t is None:                       # a dtype or layout the direct reader does not know
            with safe_open(str(path), "pt") as f:
                t = f.get_tensor(name)
            self._bar.update(t.nbytes)
        if shape is not None:
            ok = len(shape) == t.dim() and all(s is None or s == d for s, d in zip(shape, t.shape))
            if not ok:
                raise CheckpointError(f"{path.name}: tensor {name!r} has shape {tuple(t.shape)}, expected {shape}")
        return t

    def get_float(self, name: str, shape=None, dtype=torch.float32) -> torch.Tensor:
        if shape is not None and len(shape) == 2 and None not in shape and modelopt.is_nvfp4(self, name):
            return modelopt.dequantize(self, name, shape, dtype)     # NVFP4 dense linears: float once at load
        t = self.get(name, shape)
        if t.dtype == torch.float8_e4m3fn and self.has(f"{name}_scale_inv"):   # FP8 128x128 blocks: never the raw e4m3
            return dequantize_fp8_block(t, block_scales(self.get(f"{name}_scale_inv"))).to(dtype)
        if not t.is_floating_point():
            raise CheckpointError(f"{self.file_of[name].name}: tensor {name!r} has dtype {t.dtype}, expected a float type")
        head = t.reshape(-1)[:4096]     # a sample: damaged files are NaN throughout, scanning all costs a pass
        if head.numel() and bool(torch.isnan(head).all()):
            raise CheckpointError(f"{self.file_of[name].name}: tensor {name!r} is NaN (every value "
                                  "sampled): the file is damaged")
        return t.to(dtype)

    def prebuilt_experts(self):
        """An HF checkpoint has no prebuilt expert pool (an FTW file has, see weights/ftw/reader.py)."""
        return None

    def reading(self, section: str):
        """Marks the tensors a model reads for one purpose (the converter records them)."""
        return contextlib.nullcontext()

    def close(self):
        for h in self._handles.values():
            h.close()
        self._handles.clear()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
