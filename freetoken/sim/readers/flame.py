"""FLAME-MoE training-time traces (CMU-FLAME/FLAME-MoE-Traces, one file per layer).

``.pt``: a dict with ``indices`` int64 [N, k] (routed ids, highest score first) and
``layer``. ``.csv``: ``layer_id,token_id,expert_0..expert_{E-1}`` with the routed
experts' scores non-zero. A folder reads every layer file in it (``.pt`` preferred);
a single file reads that one layer. Teacher-forced rows are replayed as decode steps
(use ``--prompt-tokens`` to treat a first stretch as the prompt).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from freetoken.sim.trace import DECODE, Cell, Trace, TraceError

_LAYER = re.compile(r"_layer(\d+)_")


def _layer_number(path: Path) -> int:
    m = _LAYER.search(path.name)
    if not m:
        raise TraceError(f"{path}: file name has no _layer<N>_ part")
    return int(m.group(1))


def _read_pt(path: Path) -> tuple[np.ndarray, int]:
    import torch

    try:
        data = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:  # torch raises many kinds for a bad zip/pickle
        raise TraceError(f"{path}: cannot load as a torch file ({type(e).__name__})") from None
    if not isinstance(data, dict) or "indices" not in data:
        raise TraceError(f"{path}: expected a dict with field 'indices'")
    indices = data["indices"]
    if indices.ndim != 2:
        raise TraceError(f"{path}: field 'indices' must be 2-D [tokens, k], got shape {tuple(indices.shape)}")
    num_experts = int(data["num_experts"]) if "num_experts" in data else int(indices.max()) + 1
    return indices.numpy().astype(np.int64), num_experts


def _read_csv(path: Path) -> tuple[np.ndarray, int]:
    with open(path, encoding="utf-8") as f:
        header = f.readline().strip().split(",")
    if header[:2] != ["layer_id", "token_id"] or not header[2:]:
        raise TraceError(f"{path}: header must start with layer_id,token_id,expert_0,...")
    try:
        scores = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)[:, 2:]
    except ValueError as e:
        raise TraceError(f"{path}: non-numeric score ({e})") from None
    routed = scores > 0
    k = int(routed.sum(axis=1).max())
    if (routed.sum(axis=1) != k).any():
        raise TraceError(f"{path}: rows have differing numbers of non-zero expert scores")
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # highest score first, as in .pt
    return order.astype(np.int64), scores.shape[1]


def _layer_files(folder: Path) -> list[Path]:
    pts = sorted(folder.glob("*_layer*_*.pt"), key=_layer_number)
    return pts or sorted(folder.glob("*_layer*_*.csv"), key=_layer_number)


def read_flame(path) -> Trace:
    path = Path(path)
    files = _layer_files(path) if path.is_dir() else [path]
    if not files:
        raise TraceError(f"{path}: folder holds no *_layer<N>_*.pt or .csv files")
    layers = []
    num_experts = 0
    for f in files:
        ids, e = _read_pt(f) if f.suffix == ".pt" else _read_csv(f)
        layers.append(ids)
        num_experts = max(num_experts, e)
    tokens, top_k = layers[0].shape
    for f, ids in zip(files, layers):
        if ids.shape != (tokens, top_k):
            raise TraceError(f"{f}: shape {ids.shape} differs from {files[0].name}'s {(tokens, top_k)}")
    numbers = [_layer_number(f) for f in files]
    rows = [[tuple(sorted(r)) for r in ids.tolist()] for ids in layers]
    cells = [Cell(0, DECODE, t, j, (rows[j][t],)) for t in range(tokens) for j in range(len(files))]
    notes = [
        f"teacher-forced training forward pass replayed as {tokens} decode steps",
        f"source layers {numbers} renumbered 0..{len(files) - 1}; always-active shared experts are not traced",
    ]
    name = path.name if path.is_dir() else files[0].name
    model = files[0].name.split("_runid")[0]
    return Trace(name, model, len(files), num_experts, top_k, cells, [], notes)
