"""Where every expert's bytes lie in the model file, for the disk tier (experts/disk/backend.py):
the `DiskLayout` (experts/disk/pieces.py) of an FTW, GGUF or safetensors checkpoint.

A `DiskLayout` describes the expert pool without holding it: for each bank, the shape and
dtype of one expert's row (what `ExpertPool.banks[name][flat]` would be) and the pieces of
that row in the file. Each piece is contiguous in the file (a GGUF/FTW expert's rows are
contiguous per tensor; a safetensors checkpoint has one tensor per expert matrix), so one
expert is read with one `pread` per piece:

  FTW          one piece per bank: bank tensor offset + flat * row bytes
  GGUF         ggml: gate, up and down each one piece (blk.N.ffn_{gate,up,down}_exps, expert
               e's rows); with mixed types (Q4_K_M) one piece per row width, and rows narrower
               than the bank row placed row by row (`pitch`, zero padding); float: gate_up the
               gate piece and the up piece, types cast to the engine dtype
  safetensors  per-expert gate/up/down tensors, or the fused `gate_up_proj` row e

Tiny per-expert banks (ggml type ids, gpt-oss biases) are `resident`: read once at start.
Formats the file does not store as the banks hold them (re-encoding with --expert-format,
FP8/NVFP4 checkpoints, models with their own pool builder) have no layout here: convert to
FTW first, whose banks are the runtime layout for every architecture and format.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import torch

from ..errors import CheckpointError
from ..experts.disk.pieces import BankLayout, DiskLayout, Piece, elsize as _elsize
from ..experts.memory.pool import ExpertSpec
from ..quant import ggml_quants
from ..weights import modelopt
from ..weights.ftw.format import dtype_from_name
from ..weights.ftw.reader import FtwFile
from ..weights.gguf.reader import GgufFile
from ..weights.gguf.experts import expert_biases, expert_tensors, layout
from ..weights.gguf.types import BF16, F16, F32
from ..models.decoder import MoECausalLM


def _row_pieces(n: int, offsets, nbytes: int, dst: int = 0, **kw) -> Piece:
    return Piece(np.zeros(n, np.int32), np.asarray(offsets, np.int64), int(nbytes), dst, **kw)


# --- FTW: the banks are stored in their runtime layout -----------------------------------
def ftw_layout(ck) -> DiskLayout:
    ex = ck.header.get("experts")
    if not ex:
        raise CheckpointError(f"{ck.path}: no expert banks in this FTW file")
    L, E = ex["num_layers"], ex["num_experts"]
    n = L * E
    spec = ExpertSpec(**ex["spec"])
    want = ck.float_experts_dtype
    banks, resident = {}, {}
    for e in (e for e in ck.entries if e.kind == "bank"):
        stored = dtype_from_name(e.dtype)
        row = e.nbytes // n
        if _small(e.name):
            resident[e.name] = _read_resident(ck.path, e.offset, e.nbytes, stored, tuple(e.shape))
            continue
        cast = spec.fmt == "float" and want is not None and stored != want and stored.is_floating_point
        dt = want if cast else stored
        banks[e.name] = BankLayout(dt, tuple(e.shape[1:]), [_row_pieces(
            n, e.offset + np.arange(n, dtype=np.int64) * row, row, file_dtype=stored if cast else None)])
    return DiskLayout([Path(ck.path)], banks, L, E, spec, resident)


def _small(name: str) -> bool:
    return name.endswith("_types") or name.endswith("_bias")


def _read_resident(path: Path, offset: int, nbytes: int, dtype: torch.dtype, shape) -> torch.Tensor:
    with open(path, "rb") as f:
        f.seek(offset)
        raw = f.read(nbytes)
    if len(raw) < nbytes:
        raise CheckpointError(f"{path}: truncated: expert metadata needs bytes {offset}..{offset + nbytes}")
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape).clone()


# --- GGUF: merged expert tensors [E, rows, cols] per MoE block ---------------------------
def gguf_layout(ck) -> DiskLayout:
    blocks, parts = expert_tensors(ck)
    if not blocks:
        raise CheckpointError(f"{ck.path}: no routed experts in this GGUF file")
    e, inter, hidden = parts[0][0].shape
    L, n = len(blocks), len(blocks) * e
    gpt_oss = ck.arch == "gpt-oss"
    spec_kw = dict(activation="swiglu_oai", alpha=1.702, limit=7.0) if gpt_oss else {}
    kind = layout({t.ggml_type for trio in parts for t in trio})
    paths = [h.path for h in ck.headers]
    file_of = {id(h): i for i, h in enumerate(ck.headers)}
    local = np.arange(e, dtype=np.int64)

    def piece(which: int, per_expert: int, dst: int, **kw) -> Piece:
        files = np.empty(n, np.int32)
        offs = np.empty(n, np.int64)
        for m in range(L):
            h, t = ck.tensors_by_name[parts[m][which].name]
            files[m * e:(m + 1) * e] = file_of[id(h)]
            offs[m * e:(m + 1) * e] = t.offset + local * per_expert
        return Piece(files, offs, per_expert, dst, **kw)

    resident: dict[str, torch.Tensor] = {}
    if kind == "ggml":
        if ck.expert_format:
            raise CheckpointError(f"{ck.path}: the experts are already quantized by llama.cpp; drop --expert-format")
        banks = {}
        for which, name, rows, cols in ((0, "gate", inter, hidden), (1, "up", inter, hidden), (2, "down", hidden, inter)):
            widths = [ggml_quants.row_bytes(trio[which].ggml_type, cols) for trio in parts]
            w, pieces = max(widths), []
            for rb in sorted(set(widths)):        # mixed types (Q4_K_M): one piece per row width
                pc = piece(which, rows * rb, 0, **(dict(rows=rows, pitch=w) if rb != w else {}))
                keep = np.zeros(n, bool)
                for m in (m for m, x in enumerate(widths) if x == rb):
                    keep[m * e:(m + 1) * e] = True
                pc.files[~keep] = -1
                pieces.append(pc)
            banks[name] = BankLayout(torch.uint8, (rows, w), pieces)
        resident["gate_up_types"] = torch.tensor([[g.ggml_type, u.ggml_type] for g, u, _ in parts],
                                                 dtype=torch.int32).repeat_interleave(e, 0)
        resident["down_types"] = torch.tensor([[d.ggml_type] for _, _, d in parts],
                                              dtype=torch.int32).repeat_interleave(e, 0)
        spec = ExpertSpec(hidden=hidden, intermediate=inter, fmt="ggml", **spec_kw)
    elif kind == "float":
        if ck.expert_format:
            raise CheckpointError(f"{ck.path}: the disk tier reads float experts as the file has them; "
                                  "convert to FTW with --expert-format first (freetoken convert)")
        types = {t.ggml_type for trio in parts for t in trio}
        if len(types) != 1:
            raise CheckpointError(f"{ck.path}: the disk tier needs one float type for all expert tensors")
        ft = {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16}[types.pop()]
        dt = ck.float_experts_dtype
        es, cast = _elsize(ft), ft if ft != dt else None
        banks = {
            "gate_up": BankLayout(dt, (2 * inter, hidden), [
                piece(0, inter * hidden * es, 0, file_dtype=cast),
                piece(1, inter * hidden * es, inter * hidden * _elsize(dt), file_dtype=cast)]),
            "down": BankLayout(dt, (hidden, inter), [piece(2, hidden * inter * es, 0, file_dtype=cast)])}
        spec = ExpertSpec(hidden=hidden, intermediate=inter, **spec_kw)
    else:
        raise CheckpointError(f"{ck.path}: expert types without a CPU kernel are dequantized at load; "
                              "the disk tier cannot serve them (load into RAM)")
    if gpt_oss:
        resident.update(expert_biases(ck, blocks, e, inter, hidden))
    return DiskLayout(paths, banks, L, e, spec, resident)


# --- safetensors: one tensor per expert matrix (or the fused per-layer layout) ------------
_ST_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def _st_header(path: Path) -> dict:
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        meta = json.loads(f.read(size))
    base = 8 + size
    return {k: (v["dtype"], tuple(v["shape"]), base + v["data_offsets"][0], v["data_offsets"][1] - v["data_offsets"][0])
            for k, v in meta.items() if k != "__metadata__"}


def safetensors_layout(model, ck, cfg) -> DiskLayout:
    """The decoder's own pool layout (models/decoder.py build_pool) over an HF directory."""
    if type(model).build_pool is not MoECausalLM.build_pool:
        raise CheckpointError(f"{ck.dir}: {type(model).__name__} builds its experts its own way; "
                              "convert to FTW for the disk tier (freetoken convert)")
    if cfg.expert_format:
        raise CheckpointError(f"{ck.dir}: the disk tier reads experts as the files have them; convert to FTW "
                              f"with --expert-format {cfg.expert_format} first (freetoken convert)")
    e, inter, h = model.num_experts(), model.expert_intermediate(), model.hidden
    g, u, d = model.arch.expert_names
    p0 = f"model.layers.{model.moe_layers[0]}.{model.arch.moe_prefix}.experts.0.{g}.weight"
    if modelopt.is_nvfp4(ck, p0) or ck.has(f"{p0}_scale_inv"):
        raise CheckpointError(f"{ck.dir}: quantized HF experts: convert to FTW for the disk tier")
    paths = sorted(set(ck.file_of.values()))
    idx = {p: i for i, p in enumerate(paths)}
    headers = {p: _st_header(p) for p in paths}
    dt = model.expert_dtype
    L, n = len(model.moe_layers), len(model.moe_layers) * e
    pieces = {k: [np.zeros(n, np.int32), np.zeros(n, np.int64)] for k in ("g", "u", "d")}
    ftype = None

    def where(name, shape):
        nonlocal ftype
        path = ck.file_of.get(name)
        if path is None:
            raise CheckpointError(f"{ck.dir}: tensor {name!r} not found in the checkpoint")
        st, shp, off, nb = headers[path][name]
        if shp != shape:
            raise CheckpointError(f"{path.name}: tensor {name!r} has shape {shp}, expected {shape}")
        if st not in _ST_DTYPES or (ftype is not None and _ST_DTYPES[st] != ftype):
            raise CheckpointError(f"{path.name}: tensor {name!r}: the disk tier needs one float dtype for all experts")
        ftype = _ST_DTYPES[st]
        return idx[path], off, nb

    fused = False
    for m, i in enumerate(model.moe_layers):
        p = f"model.layers.{i}.{model.arch.moe_prefix}.experts"
        if ck.has(f"{p}.gate_up_proj"):           # transformers-5 fused layout: expert x's row is contiguous
            fused = True
            fi, off, nb = where(f"{p}.gate_up_proj", (e, 2 * inter, h))
            fd, offd, nbd = where(f"{p}.down_proj", (e, h, inter))
            rows = slice(m * e, (m + 1) * e)
            pieces["g"][0][rows], pieces["g"][1][rows] = fi, off + np.arange(e) * (nb // e)
            pieces["d"][0][rows], pieces["d"][1][rows] = fd, offd + np.arange(e) * (nbd // e)
            continue
        for x in range(e):
            for key, name, shape in (("g", g, (inter, h)), ("u", u, (inter, h)), ("d", d, (h, inter))):
                fi, off, _ = where(f"{p}.{x}.{name}.weight", shape)
                pieces[key][0][m * e + x], pieces[key][1][m * e + x] = fi, off
    es, cast = _elsize(ftype), (ftype if ftype != dt else None)
    half = inter * h * es
    gu = ([Piece(*pieces["g"], 2 * half, 0, file_dtype=cast)] if fused else
          [Piece(*pieces["g"], half, 0, file_dtype=cast),
           Piece(*pieces["u"], half, inter * h * _elsize(dt), file_dtype=cast)])
    banks = {"gate_up": BankLayout(dt, (2 * inter, h), gu),
             "down": BankLayout(dt, (h, inter), [Piece(*pieces["d"], half, 0, file_dtype=cast)])}
    return DiskLayout(paths, banks, L, e, ExpertSpec(hidden=h, intermediate=inter), {})


def disk_layout(model, ck, cfg) -> DiskLayout:
    """The layout of `ck`'s experts (FTW, GGUF or safetensors), sizes checked against the files."""
    if isinstance(ck, FtwFile):
        out = ftw_layout(ck)
    elif isinstance(ck, GgufFile):
        out = gguf_layout(ck)
    else:
        out = safetensors_layout(model, ck, cfg)
    out.check_sizes()
    return out
