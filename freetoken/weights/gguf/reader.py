"""A GGUF file (llama.cpp, Ollama, LM Studio) seen as a checkpoint: the HF-style config from
its metadata (weights/gguf/config.py), dense tensors under their HF names (weights/gguf/names.py), and the
routed experts as a prebuilt expert pool.

Dense tensors in a quantized type are offered packed (`packed`: the file's rows, copied once) for the C kernels of layers/ggml_linear.py; `get` dequantizes them (the GPU path,
types without a kernel, tensors the converter transformed across columns). Merged expert tensors (`blk.N.ffn_{gate,up,down}_exps`)
stay in their ggml type: each output row's raw block bytes go into the "ggml" banks the C
kernels read (experts/formats.py); F32/F16/BF16 experts become ordinary float banks."""
from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path

import numpy as np
import torch

from ...errors import CheckpointError
from .config import synth_config
from .experts import build_pool
from .hybrid import HYBRID, rows_only, undo
from .meta import GgufHeader, TensorInfo, byte_shape, read_header
from .names import combine, derived, hf_names, needs_unpermute, unpermute_rows
from .types import dequantize
from ...layers.ggml_linear import KERNEL_TYPES, GgmlWeight
from ...progress import progress
from ..pread import RangeReader

log = logging.getLogger("freetoken.weights")
_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def is_gguf(path: str | os.PathLike) -> bool:
    p = Path(path)
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        return f.read(4) == b"GGUF"


def split_parts(path: str | os.PathLike) -> list[Path]:
    """All files of a split GGUF (`NAME-00001-of-00003.gguf`, given any part), else [path]."""
    p = Path(path)
    m = _SPLIT.match(p.name)
    if m is None:
        return [p]
    count = int(m["count"])
    parts = [p.with_name(f"{m['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [q.name for q in parts if not q.is_file()]
    if missing:
        raise CheckpointError(f"{p}: split GGUF is missing part(s) {', '.join(missing)} (expected {count} parts "
                              f"in {p.parent})")
    return parts


class GgufFile:
    """Checkpoint interface (config, has/get/get_float) over one GGUF (all parts of a split one)."""

    def __init__(self, path: str | os.PathLike, cfg=None):
        # the vocabulary's string arrays are the tokenizer's (weights/gguf/tokenizer.py), not needed here
        headers = [read_header(p, string_arrays=False) for p in split_parts(path)]
        fields = headers[0].fields
        shapes = {n: t.shape for h in headers for n, t in h.tensors.items()}
        self._setup(path, headers, fields.get("general.architecture"),
                    lambda: synth_config(fields, shapes, Path(path)), cfg)

    def _setup(self, path, headers: list[GgufHeader], arch, config, cfg) -> None:
        """The tensor table of `headers` (their files and offsets), the HF config (`config()`
        builds it) and the name maps; shared with a GGUF kept in an FTW file (weights/ftw/from_gguf.py)."""
        self.path = self.dir = Path(path)
        self.headers = headers
        self.tensors_by_name: dict[str, tuple[GgufHeader, TensorInfo]] = {}
        for h in self.headers:
            for name, t in h.tensors.items():
                self.tensors_by_name[name] = (h, t)
        if "token_embd.weight" not in self.tensors_by_name:
            raise CheckpointError(f"{self.path}: tensor token_embd.weight missing (not a language model GGUF?)")
        self.arch = arch
        self.config = config()
        self._hf = {hf: n for n in self.tensors_by_name for hf in hf_names(self.arch, n)}
        self._derived = derived(self.arch, self.tensors_by_name)
        for hf, sources in self._derived.items():
            missing = [s for s in sources if s not in self.tensors_by_name]
            if missing:
                raise CheckpointError(f"{self.path}: tensor {missing[0]!r} missing (needed with {sources[0]!r})")
        self.float_experts_dtype = cfg.torch_dtype if cfg is not None else torch.float32
        self.expert_format = getattr(cfg, "expert_format", None)
        self._readers: dict = {}
        self._bar = None

    def _open_reader(self, path: Path, on_bytes):
        return RangeReader(path, on_bytes=on_bytes)

    def names(self) -> list[str]:
        return sorted([*self._hf, *self._derived])

    def has(self, name: str) -> bool:
        return name in self._hf or name in self._derived

    def tensor_info(self, gguf_name: str) -> TensorInfo | None:
        hit = self.tensors_by_name.get(gguf_name)
        return hit[1] if hit else None

    def reader(self, gguf_name: str):
        """(RangeReader of the file holding the tensor, its TensorInfo): reads go straight into
        the caller's buffer with the page cache dropped behind (weights/pread.py)."""
        h, t = self.tensors_by_name[gguf_name]
        r = self._readers.get(h.path)
        if r is None:
            if self._bar is None:
                self._bar = progress(sum(t.nbytes for _, t in self.tensors_by_name.values()), f"load {self.path.name}")
            r = self._readers[h.path] = self._open_reader(h.path, self._bar.update)
        return r, t

    def raw(self, gguf_name: str) -> np.ndarray:
        """The tensor's bytes, u8 [..., rows, row_bytes], read into a new array."""
        r, t = self.reader(gguf_name)
        return r.array(t.offset, t.nbytes).reshape(byte_shape(t))

    def _read(self, g: str) -> torch.Tensor:
        t = self.tensors_by_name[g][1]
        return dequantize(self.raw(g), t.ggml_type, t.shape, owned=True)

    def get(self, name: str, shape: tuple | None = None) -> torch.Tensor:
        g = self._hf.get(name)
        if g is None and name in self._derived:
            parts = [self._read(s) for s in self._derived[name]]
            same = all(p.dtype == parts[0].dtype for p in parts)      # else f32: an f16 k_b beside a q8_0 v_b
            out = combine(name, [p.float() for p in parts]).to(parts[0].dtype if same else torch.float32)
            g, got = "+".join(self._derived[name]), tuple(out.shape)
        elif g is None:
            raise CheckpointError(f"{self.path}: tensor {name!r} not found in the GGUF file")
        else:
            out, got = None, self.tensors_by_name[g][1].shape
        fits = shape is None or (len(shape) == len(got) and all(s in (None, d) for s, d in zip(shape, got)))
        if not fits:
            raise CheckpointError(f"{self.path}: tensor {g!r} ({name}) has shape {got}, expected {tuple(shape)}")
        if out is None:
            out = self._read(g)
        if needs_unpermute(self.arch, name):
            heads = self.config["num_attention_heads"] if ".q_proj." in name else self.config["num_key_value_heads"]
            out = unpermute_rows(out, heads)
        if self.arch in HYBRID:
            out = undo(self.arch, name, out, self.config)
        return out

    def packed(self, name: str, shape: tuple | None = None):
        """Dense tensor `name` as `GgmlWeight` rows in the file's quantized type (its bytes,
        rows put back in order where the converter permuted them), or None: float types, types without a C kernel, and
        tensors the converter split or regrouped across columns (read those with `get`)."""
        g = self._hf.get(name)
        if g is None:
            return None
        t = self.tensors_by_name[g][1]
        if t.ggml_type not in KERNEL_TYPES or len(t.shape) != 2:
            return None
        if self.arch in HYBRID and not rows_only(self.arch, name, self.config):
            return None
        # read once into its own buffer: resident like any loaded weight, and safe if the file changes
        rows = torch.from_numpy(self.raw(g))
        if needs_unpermute(self.arch, name):
            heads = self.config["num_attention_heads"] if ".q_proj." in name else self.config["num_key_value_heads"]
            rows = unpermute_rows(rows, heads).contiguous()
        if self.arch in HYBRID:
            rows = undo(self.arch, name, rows, self.config).contiguous()
        if shape is not None and tuple(shape) != (rows.shape[0], t.shape[1]):
            raise CheckpointError(f"{self.path}: tensor {g!r} ({name}) has shape {(rows.shape[0], t.shape[1])}, "
                                  f"expected {tuple(shape)}")
        return GgmlWeight(rows, t.ggml_type, t.shape[1])

    def get_float(self, name: str, shape=None, dtype=torch.float32) -> torch.Tensor:
        return self.get(name, shape).to(dtype)

    def prebuilt_experts(self):
        return build_pool(self)

    def nextn_experts(self, block: int):
        """The expert pool of nextn block `block` alone (`--speculative mtp`)."""
        return build_pool(self, [block])

    def reading(self, section: str):
        return contextlib.nullcontext()

    def close(self):
        for r in self._readers.values():
            r.close()
        self._readers.clear()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
