"""Reading an FTW file (format in weights/ftw/format.py) at disk speed.

Every tensor is read once, by several threads, and each CHUNK_BYTES piece is hashed as soon
as it lands, by threads of its own (weights/ftw/load.py). By default the file is mapped copy-on-write and the threads
bring its pages in (weights/ftw/map.py: no fresh memory to fault in and zero, no copy); else each
tensor is read into its own page-aligned, exactly-sized buffer (O_DIRECT when the file
system allows it, else ordinary reads). Expert banks come back as
an ExpertPool in their runtime layout; the other tensors answer the Checkpoint interface,
so models load from an FTW file exactly as from an HF directory."""
from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

import torch

from ...errors import CheckpointError
from .format import MAGIC, PREAMBLE, READABLE, TensorEntry, config_hash
from .load import TensorLoad
from ..validate import check_config, check_header_size
from ...experts.memory.pool import ExpertPool, ExpertSpec

log = logging.getLogger("freetoken.weights")


def is_ftw(path: str | os.PathLike) -> bool:
    p = Path(path)
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


def read_header(path: Path) -> dict:
    """The validated header: magic, format version, header checksum, config hash."""
    with open(path, "rb") as f:
        pre = f.read(PREAMBLE.size)
        if len(pre) < PREAMBLE.size or pre[:len(MAGIC)] != MAGIC:
            raise CheckpointError(f"{path}: not an FTW file (expected magic {MAGIC!r} at byte 0)")
        _, version, _, size, digest = PREAMBLE.unpack(pre)
        if version not in READABLE:
            raise CheckpointError(f"{path}: FTW format version {version}, this FreeToken reads versions "
                                  f"{', '.join(map(str, READABLE))}; re-run `freetoken convert`")
        check_header_size(path, size, os.fstat(f.fileno()).st_size)
        body = f.read(size)
    if len(body) < size:
        raise CheckpointError(f"{path}: truncated inside the header ({len(body)} of {size} bytes)")
    from xxhash import xxh3_64_intdigest
    if xxh3_64_intdigest(body) != digest:
        raise CheckpointError(f"{path}: header checksum mismatch (the tensor table is corrupt)")
    try:
        header = json.loads(body)
        if config_hash(header["config"]) != header["config_hash"]:
            raise CheckpointError(f"{path}: config hash mismatch (config.json inside the file was altered)")
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise CheckpointError(f"{path}: malformed FTW header ({type(e).__name__}: {str(e)[:100]})") from None
    check_config(header["config"], f"{path}: config")
    return header


def read_tensors(path: Path, entries: list[TensorEntry], verify: bool = True, threads: int | None = None,
                 direct: bool = True, desc: str | None = None, mapped: bool = True) -> dict[str, torch.Tensor]:
    """name -> tensor for `entries`, read in parallel; checksums verified while reading.
    `mapped`: the tensors are views of a copy-on-write mapping of the file (weights/ftw/map.py), else
    (or where mapping is not available) they are read into buffers of their own, with
    O_DIRECT when `direct` and the file system allow it."""
    return TensorLoad(path, entries, verify, threads, direct, mapped, desc).finish()


class FtwFile:
    """An FTW file seen as a checkpoint (config, has/get/get_float) plus its prebuilt pool.
    `background`: the constructor returns while the tensors are still being read; `get`
    waits for the tensor it returns, `close()` for all of them (and raises on a checksum
    mismatch), `abandon()` stops the reading. Else everything is read and verified here."""

    def __init__(self, path: str | os.PathLike, verify: bool = True, threads: int | None = None,
                 direct: bool = True, mapped: bool = True, background: bool = False, banks: bool = True):
        self.path = self.dir = Path(path)
        header = read_header(self.path)
        self.header, self.config = header, header["config"]
        try:
            self.entries = [TensorEntry.from_json(t) for t in header["tensors"]]
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{self.path}: malformed tensor table ({e})") from None
        self.direct = direct
        self.float_experts_dtype: torch.dtype | None = None    # set by open_checkpoint from the engine options
        # banks=False (the disk tier): the expert banks stay in the file, read per expert later
        self._load = TensorLoad(self.path, [e for e in self.entries if banks or e.kind != "bank"],
                                verify, threads, direct, mapped)
        self._tensors = self._load.tensors
        if not background:
            self._load.finish()
        self._dense = {e.name for e in self.entries if e.kind == "dense"}

    @property
    def options(self) -> dict:
        return self.header.get("options") or {}

    def names(self) -> list[str]:
        return sorted(self._dense)

    def has(self, name: str) -> bool:
        return name in self._dense

    def get(self, name: str, shape: tuple | None = None) -> torch.Tensor:
        if name not in self._dense:
            raise CheckpointError(f"{self.path}: tensor {name!r} not found in the FTW file")
        self._load.wait([name])
        t = self._tensors[name]
        if shape is not None and not (len(shape) == t.dim() and all(s is None or s == d for s, d in zip(shape, t.shape))):
            raise CheckpointError(f"{self.path}: tensor {name!r} has shape {tuple(t.shape)}, expected {shape}")
        return t

    def get_float(self, name: str, shape=None, dtype=torch.float32) -> torch.Tensor:
        t = self.get(name, shape)
        if not t.is_floating_point():
            raise CheckpointError(f"{self.path}: tensor {name!r} has dtype {t.dtype}, expected a float type")
        return t.to(dtype)

    def file_bytes(self, name: str) -> bytes | None:
        t = self._tensors.get(name)
        if t is None or name in self._dense:
            return None
        self._load.wait([name])
        return bytes(t.numpy())

    def prebuilt_experts(self):
        ex = self.header.get("experts")
        if not ex:
            return None
        banks = {e.name: self._tensors[e.name] for e in self.entries if e.kind == "bank"}
        spec = ExpertSpec(**ex["spec"])
        want = self.float_experts_dtype
        convert = spec.fmt == "float" and want is not None and banks["gate_up"].dtype != want
        if convert or not self._load.mapped:     # a mapped bank reads the file's bytes even before they are in
            self._load.wait(banks)
        if convert:
            log.warning("%s: experts stored as %s, converting to %s at load (convert with --dtype to skip this)",
                        self.path, banks["gate_up"].dtype, want)
            banks = {k: v if k.endswith("_bias") else v.to(want) for k, v in banks.items()}
        return ExpertPool(banks, ex["num_layers"], ex["num_experts"], spec)

    def reading(self, section: str):
        return contextlib.nullcontext()

    def close(self):
        """Waits for every tensor to be read and verified (CheckpointError naming a corrupt
        one) and drops the dense tensors (the model holds what it uses)."""
        self._load.finish()
        self._tensors = {k: v for k, v in self._tensors.items() if k not in self._dense}

    def abandon(self):
        """Stops a background read (the model build failed)."""
        self._load.cancel()


def read_side_file(path: str | os.PathLike, name: str) -> bytes | None:
    """One side file (tokenizer.json, ...) of an FTW file, verified, without reading the rest."""
    path = Path(path)
    entry = next((TensorEntry.from_json(t) for t in read_header(path)["tensors"]
                  if t["name"] == name and t["kind"] == "file"), None)
    if entry is None:
        return None
    return bytes(read_tensors(path, [entry], threads=1, direct=False, desc=f"read {name}", mapped=False)[name].numpy())
