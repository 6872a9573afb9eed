"""ggml banks on the device path: the cache slots hold the file's packed bytes and torch
dequantizes the gathered slots there (on any device; the CPU tests run the same code). No float
copy of an expert exists outside the few slots one call gathers.

A slot holds any layer's expert, so the slots one call gathers may hold different types (a
dynamic mix: gate, up, down and the layers each in their own type). The types ride along in
the slot (`gate_up_types`, `down_types`) and are read on the device only: each type the pool
holds for that half dequantizes every gathered row (the row's own bytes, a prefix of the slot
row) and `torch.where` keeps the rows that are of that type. Fixed shapes, no host
synchronisation; the dequantization work grows with the number of types per half in the pool
(1 for llama.cpp's uniform files, 2-3 for its mixes and the dynamic ones)."""
from __future__ import annotations

import torch

from ..quant import ggml_quants as gq

HALVES = ("gate", "up", "down")


def bank_types(banks: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    """{"gate", "up", "down"}: the ggml types present in these banks (reads them on the host:
    callers on a device compute this once, from the host pool, with `pool_types`)."""
    gut, dnt = banks["gate_up_types"].cpu(), banks["down_types"].cpu()
    return {"gate": tuple(sorted(set(gut[:, 0].tolist()))), "up": tuple(sorted(set(gut[:, 1].tolist()))),
            "down": tuple(sorted(set(dnt[:, 0].tolist())))}


def pool_types(pool) -> dict[str, tuple[int, ...]] | None:
    """The ggml types of every group of an `ExpertPool` / `GroupedPool` (None: not ggml banks)."""
    if pool.spec.fmt != "ggml":
        return None
    per = [bank_types(g.banks) for g in pool.groups]
    return {h: tuple(sorted({t for p in per for t in p[h]})) for h in HALVES}


def dequantize_rows(rows: torch.Tensor, types: torch.Tensor, cols: int, candidates, out: torch.Tensor) -> torch.Tensor:
    """rows u8 [P, R, >= widest row]; types int [P] (the type of each gathered expert's rows);
    candidates: the types that may occur -> float32 `out` [P, R, cols], bit-exact to
    `gguf.quants.dequantize` of each row in its own type."""
    for i, t in enumerate(candidates):
        d = gq.dequantize(rows, t, cols)
        if i == 0:
            out.copy_(d)
        else:
            out.copy_(torch.where((types == t).view(-1, 1, 1), d, out))
    return out


def gather_dequant(banks: dict[str, torch.Tensor], slots: torch.Tensor, which: str, hidden: int,
                   intermediate: int, types: dict[str, tuple[int, ...]]) -> torch.Tensor:
    """float32 [P, rows, cols] of `which` ("gate_up": the gate and up banks' rows, gate first |
    "down") at slot ids `slots` (a tensor on the banks' device)."""
    if which == "down":
        rows, ty = banks["down"].index_select(0, slots), banks["down_types"].index_select(0, slots)
        out = torch.empty(rows.shape[0], hidden, intermediate, dtype=torch.float32, device=rows.device)
        return dequantize_rows(rows, ty[:, 0], intermediate, types["down"], out)
    ty, I = banks["gate_up_types"].index_select(0, slots), intermediate
    out = torch.empty(ty.shape[0], 2 * I, hidden, dtype=torch.float32, device=ty.device)
    for half, (name, rows) in enumerate((("gate", slice(0, I)), ("up", slice(I, 2 * I)))):
        dequantize_rows(banks[name].index_select(0, slots), ty[:, half], hidden, types[name], out[:, rows])
    return out


def type_count(types: dict[str, tuple[int, ...]] | None) -> int:
    """The most types of one half: how many dequantizations a gathered row may take."""
    return max((len(v) for v in types.values()), default=1) if types else 1
