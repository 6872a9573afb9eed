"""The FTW file format (FreeToken Weights): a model in its runtime layout, read at disk speed.

    [0, 32)      preamble: magic b"FREETOKW", u32 format version, u32 0, u64 header bytes,
                 u64 xxh3-64 of the header bytes (all little-endian)
    [32, ...)    header: UTF-8 JSON (config, config hash, options, expert pool, tensor table)
    [4 KiB ...)  data: every tensor at a 4 KiB-aligned offset, zero-padded to 4 KiB, so the
                 reader can use O_DIRECT and read straight into page-aligned buffers

Tensor kinds: "dense" (a checkpoint tensor under its HF name, bytes unchanged), "bank" (an
expert-pool bank, rows `moe_layer * num_experts + expert`, already in the chosen format),
"file" (a side file of the checkpoint directory: tokenizer, chat template, generation config)
and "ggml" (version 2: a GGUF tensor under its GGUF name, its bytes as the GGUF has them, with
its ggml type and element shape; a file converted from a GGUF holds only these and side
files, and the header's "gguf" section names the architecture, see weights/ftw/from_gguf.py).
Each tensor's checksum is the xxh3-64 of the xxh3-64 digests of its CHUNK_BYTES pieces, so
several threads can verify one tensor while they read it."""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import torch
import xxhash

MAGIC = b"FREETOKW"
VERSION = 2
READABLE = (1, 2)            # version 1: no "ggml" tensors
ALIGN = 4096
CHUNK_BYTES = 8 << 20
PREAMBLE = struct.Struct("<8sIIQQ")


def align_up(n: int, a: int = ALIGN) -> int:
    return -(-n // a) * a


def config_hash(config: dict) -> str:
    """Identity of the model config: xxh3-128 of its canonical JSON."""
    return xxhash.xxh3_128_hexdigest(json.dumps(config, sort_keys=True, separators=(",", ":")).encode())


def chunk_digest(data) -> int:
    return xxhash.xxh3_64_intdigest(data)


def combine_digests(digests: list[int]) -> str:
    return xxhash.xxh3_64_hexdigest(b"".join(d.to_bytes(8, "little") for d in digests))


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(name)
    return dt


@dataclass(frozen=True)
class TensorEntry:
    name: str
    kind: str                 # dense | bank | file
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    xxh3: str
    ggml_type: int | None = None      # kind "ggml": the GGUF tensor's type and element shape
    dims: tuple[int, ...] | None = None

    def to_json(self) -> dict:
        d = {"name": self.name, "kind": self.kind, "dtype": self.dtype, "shape": list(self.shape),
             "offset": self.offset, "nbytes": self.nbytes, "xxh3": self.xxh3}
        if self.ggml_type is not None:
            d.update(ggml_type=self.ggml_type, dims=list(self.dims))
        return d

    @classmethod
    def from_json(cls, d: dict) -> "TensorEntry":
        ggml = d.get("ggml_type")
        return cls(d["name"], d["kind"], d["dtype"], tuple(d["shape"]), int(d["offset"]), int(d["nbytes"]), d["xxh3"],
                   None if ggml is None else int(ggml), None if ggml is None else tuple(int(x) for x in d["dims"]))


def encode_preamble_and_header(header: dict) -> bytes:
    body = json.dumps(header, separators=(",", ":")).encode()
    return PREAMBLE.pack(MAGIC, VERSION, 0, len(body), xxhash.xxh3_64_intdigest(body)) + body


def header_reserve(header: dict) -> int:
    """Bytes before the first tensor: preamble + header, padded to ALIGN. The writer sizes the
    header with placeholder checksums of the final length, so offsets never move."""
    return align_up(len(encode_preamble_and_header(header)))
