"""The sizes a memory plan needs, read from config.json and the tensor headers (safetensors
or FTW) without loading a single weight."""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError
from ..weights.ftw.reader import is_ftw, read_header
from ..layers.ggml_linear import KERNEL_TYPES
from ..weights.checkpoint import Checkpoint
from ..weights.ftw.from_gguf import GgufInFtw, is_gguf_ftw
from ..weights.gguf.reader import GgufFile, is_gguf
from ..weights.gguf.experts import expert_tensors, layout, row_widths
from ..weights.partial import check_not_partial

_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
          "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "U16": 2, "U32": 4, "U64": 8}
_SKIP = ("mtp.", "model.visual.", "visual.", "model.mtp.")


@dataclass(frozen=True)
class ModelShape:
    config: dict                       # the text model's config
    dense_params: int                  # float elements of non-expert tensors (stored in the engine dtype)
    expert_bytes_on_disk: int
    native_expert_format: str          # float | mxfp4 | fp8 | prebuilt:<fmt> (FTW)
    prebuilt_expert_bytes: int | None = None   # FTW: the exact bank bytes per expert (GGUF: a cache slot's)
    # GGUF: dense tensors in a type the CPU kernels read, kept packed there: (elements, bytes)
    packed_dense: tuple[int, int] = (0, 0)
    prebuilt_pool_bytes: int | None = None     # GGUF: the pool's own bytes (each layer in its row widths)

    def get(self, *names, default=None):
        for n in names:
            if self.config.get(n) is not None:
                return self.config[n]
        return default


def _safetensors_entries(path: Path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        head = json.loads(f.read(n))
    for name, meta in head.items():
        if name != "__metadata__":
            numel = 1
            for d in meta["shape"]:
                numel *= d
            yield name, numel, numel * _BYTES.get(meta["dtype"], 2), meta["dtype"]


def _is_expert(name: str) -> bool:
    return ".experts." in name


def read_model_shape(model: str | Path) -> ModelShape:
    p = Path(model)
    check_not_partial(p)
    if p.is_file():
        if is_gguf(p):
            return _gguf_shape(GgufFile(p))
        if not is_ftw(p):
            from ..weights.file_kind import describe     # only on this error path
            raise CheckpointError(f"{p.resolve()}: {describe(p)} (expected a GGUF or FTW file or a checkpoint "
                                  "directory)")
        header = read_header(p)
        if is_gguf_ftw(header):
            return _gguf_shape(GgufInFtw(p, header=header))
        config = header["config"]
        dense = sum(_numel(t["shape"]) for t in header["tensors"]
                    if t["kind"] == "dense" and t["dtype"].startswith(("float", "bfloat")))
        banks = [t for t in header["tensors"] if t["kind"] == "bank"]
        ex = header.get("experts")
        per = sum(t["nbytes"] for t in banks) // max(1, ex["num_layers"] * ex["num_experts"]) if ex else 0
        fmt = f"prebuilt:{ex['spec']['fmt']}" if ex else "float"
        return ModelShape(_text(config), dense, sum(t["nbytes"] for t in banks), fmt, per)
    ck = Checkpoint(p)
    dense, expert_bytes = 0, 0
    for f in sorted(set(ck.file_of.values())):
        for name, numel, nbytes, dtype in _safetensors_entries(f):
            if name.startswith(_SKIP) or ".mtp." in name:
                continue
            if _is_expert(name):
                expert_bytes += nbytes
            elif dtype in ("F32", "F16", "BF16", "F64"):
                dense += numel
    quant = (ck.config.get("quantization_config") or {}).get("quant_method", "")
    native = "mxfp4" if quant == "mxfp4" else "fp8" if quant == "fp8" else "float"
    return ModelShape(_text(ck.config), dense, expert_bytes, native)


def _gguf_shape(ck) -> ModelShape:
    """GGUF (or one kept in an FTW file): quantized experts stay in their ggml rows
    (prebuilt:ggml), float ones are float."""
    infos = {n: t for n, (_, t) in ck.tensors_by_name.items()}
    dense = sum(_numel(t.shape) for n, t in infos.items() if "_exps." not in n)
    packed = [t for n, t in infos.items() if "_exps." not in n and t.ggml_type in KERNEL_TYPES and len(t.shape) == 2]
    packed_dense = (sum(_numel(t.shape) for t in packed), sum(t.nbytes for t in packed))
    expert_bytes = sum(t.nbytes for n, t in infos.items() if "_exps." in n)
    _, trios = expert_tensors(ck)
    if not trios or layout({t.ggml_type for trio in trios for t in trio}) != "ggml":
        return ModelShape(_text(ck.config), dense, expert_bytes, "float", packed_dense=packed_dense)


    e, inter, hidden = trios[0][0].shape
    extra = 3 * 4 + ((2 * inter + hidden) * 4 if ck.arch == "gpt-oss" else 0)   # type ids, gpt-oss biases
    widths = row_widths(trios)
    rows = (inter, inter, hidden)       # gate, up, down: banks of their own
    per_layer = [sum(r * w for r, w in zip(rows, ws)) + extra for ws in widths]
    # the pool holds each layer in its own widths; a cache slot holds any layer's expert: each
    # bank as wide as its widest layer (a mix's widest gate, up and down may be in different layers)
    slot = sum(r * max(w) for r, w in zip(rows, zip(*widths))) + extra
    return ModelShape(_text(ck.config), dense, expert_bytes, "prebuilt:ggml", slot, packed_dense,
                      prebuilt_pool_bytes=e * sum(per_layer))


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _text(config: dict) -> dict:
    text = config.get("text_config")
    if isinstance(text, dict):
        return {**{k: v for k, v in config.items() if k != "text_config"}, **text}
    return config
