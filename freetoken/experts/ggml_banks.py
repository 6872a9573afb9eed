"""Expert banks holding llama.cpp (GGUF) quantized rows as they are in the file.

Layout (format "ggml"; leading index = flat id, I = intermediate, H = hidden):
  gate_up       u8 [N, 2I, RB]   rows 0..I-1 gate, I..2I-1 up; each row the raw ggml blocks of
                                  that output row (H inputs), zero-padded to RB
  gate_up_types int32 [N, 2]     ggml type of the gate half, of the up half
  down          u8 [N, H, RBd]   likewise, I inputs per row
  down_types    int32 [N, 1]
RB is the widest row of the types present in the bank, so every expert has the same byte size.
A GGUF's layers of different row widths (llama.cpp's Q4_K_M mixes Q4_K and Q6_K `ffn_down`
across layers) go to separate banks, one per width (grouped_pool.py): no padding there; only a
cache slot, which holds any layer's expert, is as wide as the widest.
"""
from __future__ import annotations

import torch

from ..quant import ggml_quants as gq

KERNEL_TYPES = gq.KERNEL_TYPES   # the C kernels' dot products


def pad_rows(rows: torch.Tensor, width: int) -> torch.Tensor:
    """u8 [..., rb] -> [..., width] with zero bytes after the blocks."""
    if rows.shape[-1] > width:
        raise ValueError(f"ggml rows of {rows.shape[-1]} bytes do not fit a bank row of {width}")
    if rows.shape[-1] == width:
        return rows
    return torch.nn.functional.pad(rows, (0, width - rows.shape[-1]))


def bank_row_bytes(types, cols: int) -> int:
    """The bank row width for rows of `cols` elements in any of `types` (the widest)."""
    return max(gq.row_bytes(int(t), cols) for t in set(int(t) for t in types))


def quantize_ggml(gate_up: torch.Tensor, down: torch.Tensor, gate_type: int = gq.Q8_0,
                  up_type: int | None = None, down_type: int | None = None) -> dict[str, torch.Tensor]:
    """Float banks gate_up [N, 2I, H], down [N, H, I] -> "ggml" banks, every expert in the same
    types (up and down default to the gate's type)."""
    up_type = gate_type if up_type is None else up_type
    down_type = gate_type if down_type is None else down_type
    N, I2, H = gate_up.shape
    I = I2 // 2
    rb = bank_row_bytes((gate_type, up_type), H)
    gu = torch.cat([pad_rows(gq.quantize(gate_up[:, :I], gate_type), rb),
                    pad_rows(gq.quantize(gate_up[:, I:], up_type), rb)], 1)
    return {"gate_up": gu.contiguous(),
            "gate_up_types": torch.tensor([[gate_type, up_type]] * N, dtype=torch.int32).reshape(N, 2),
            "down": gq.quantize(down, down_type).contiguous(),
            "down_types": torch.full((N, 1), down_type, dtype=torch.int32)}


def dequantize_ggml_expert(banks: dict[str, torch.Tensor], fid: int,
                           dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate_up [2I, H], down [H, I]) of flat expert `fid` (on the banks' device)."""
    gu, dn = banks["gate_up"][fid], banks["down"][fid]
    H, I = dn.shape[0], gu.shape[0] // 2
    gt, ut = banks["gate_up_types"][fid].tolist()
    (dt,) = banks["down_types"][fid].tolist()
    g = gq.dequantize(gu[:I], gt, H)
    u = gq.dequantize(gu[I:], ut, H)
    return torch.cat([g, u], 0).to(dtype), gq.dequantize(dn, dt, I).to(dtype)


def check_ggml_banks(banks: dict[str, torch.Tensor], hidden: int, intermediate: int) -> set[int]:
    """Validates the banks' shapes against (H, I) and returns the ggml types they hold."""
    gu, gut, dn, dnt = (banks.get(k) for k in ("gate_up", "gate_up_types", "down", "down_types"))
    if any(t is None for t in (gu, gut, dn, dnt)):
        raise ValueError("ggml expert banks need gate_up, gate_up_types, down and down_types")
    N = gu.shape[0]
    for name, t, dtype, shape in (("gate_up", gu, torch.uint8, (N, 2 * intermediate)),
                                  ("gate_up_types", gut, torch.int32, (N, 2)),
                                  ("down", dn, torch.uint8, (N, hidden)),
                                  ("down_types", dnt, torch.int32, (N, 1))):
        if t.dtype != dtype or tuple(t.shape[:2]) != shape:
            raise ValueError(f"ggml bank {name}: expected {dtype} with leading shape {shape}, "
                             f"got {t.dtype} {tuple(t.shape)}")
    types = set()
    for name, tt, rows, cols in (("gate_up", gut, gu, hidden), ("down", dnt, dn, intermediate)):
        for t in torch.unique(tt).tolist():
            need = gq.row_bytes(t, cols)     # raises for unknown types and unaligned shapes
            if rows.shape[2] < need:
                raise ValueError(f"ggml bank {name}: rows of {rows.shape[2]} bytes, "
                                 f"{gq.type_name(t)} x {cols} needs {need}")
            types.add(t)
    return types


def ggml_expert_nbytes(hidden: int, intermediate: int, gate_type: int, up_type: int, down_type: int) -> int:
    """Bytes of one expert in a bank of these types (what ExpertPool.expert_nbytes will say)."""
    return (2 * intermediate * bank_row_bytes((gate_type, up_type), hidden)
            + hidden * gq.row_bytes(down_type, intermediate) + 3 * 4)
