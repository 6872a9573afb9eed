"""Expert banks holding llama.cpp (GGUF) quantized rows as they are in the file.

Layout (format "ggml"; leading index = flat id, I = intermediate, H = hidden):
  gate          u8 [N, I, RBg]   each row the raw ggml blocks of that output row (H inputs)
  up            u8 [N, I, RBu]   likewise (a bank of its own: dynamic mixes put gate and up in
                                  types of different row widths, and neither pads to the other)
  gate_up_types int32 [N, 2]     ggml type of the gate, of the up rows
  down          u8 [N, H, RBd]   likewise, I inputs per row
  down_types    int32 [N, 1]
A bank's row width is the widest row of the types present in it, so every expert has the same
byte size; narrower rows are zero-padded. A GGUF's layers of different row widths (llama.cpp's
Q4_K_M mixes Q4_K and Q6_K `ffn_down` across layers) go to separate banks, one per width
(grouped_pool.py): no padding there; only a cache slot, which holds any layer's expert, is as
wide as the widest.
"""
from __future__ import annotations

import torch

from ..quant import ggml_quants as gq

KERNEL_TYPES = gq.KERNEL_TYPES   # the C kernels' dot products


def quantize_ggml(gate_up: torch.Tensor, down: torch.Tensor, gate_type: int = gq.Q8_0,
                  up_type: int | None = None, down_type: int | None = None) -> dict[str, torch.Tensor]:
    """Float banks gate_up [N, 2I, H], down [N, H, I] -> "ggml" banks, every expert in the same
    types (up and down default to the gate's type)."""
    up_type = gate_type if up_type is None else up_type
    down_type = gate_type if down_type is None else down_type
    N, I2, H = gate_up.shape
    I = I2 // 2
    return {"gate": gq.quantize(gate_up[:, :I], gate_type).contiguous(),
            "up": gq.quantize(gate_up[:, I:], up_type).contiguous(),
            "gate_up_types": torch.tensor([[gate_type, up_type]] * N, dtype=torch.int32).reshape(N, 2),
            "down": gq.quantize(down, down_type).contiguous(),
            "down_types": torch.full((N, 1), down_type, dtype=torch.int32)}


def dequantize_ggml_expert(banks: dict[str, torch.Tensor], fid: int,
                           dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate_up [2I, H], down [H, I]) of flat expert `fid` (on the banks' device)."""
    dn = banks["down"][fid]
    H, I = dn.shape[0], banks["gate"].shape[1]
    gt, ut = banks["gate_up_types"][fid].tolist()
    (dt,) = banks["down_types"][fid].tolist()
    g = gq.dequantize(banks["gate"][fid], gt, H)
    u = gq.dequantize(banks["up"][fid], ut, H)
    return torch.cat([g, u], 0).to(dtype), gq.dequantize(dn, dt, I).to(dtype)


def check_ggml_banks(banks: dict[str, torch.Tensor], hidden: int, intermediate: int) -> set[int]:
    """Validates the banks' shapes against (H, I) and returns the ggml types they hold."""
    names = ("gate", "up", "gate_up_types", "down", "down_types")
    if any(banks.get(k) is None for k in names):
        raise ValueError("ggml expert banks need " + ", ".join(names))
    g, u, gut, dn, dnt = (banks[k] for k in names)
    N = g.shape[0]
    for name, t, dtype, shape in (("gate", g, torch.uint8, (N, intermediate)), ("up", u, torch.uint8, (N, intermediate)),
                                  ("gate_up_types", gut, torch.int32, (N, 2)),
                                  ("down", dn, torch.uint8, (N, hidden)),
                                  ("down_types", dnt, torch.int32, (N, 1))):
        if t.dtype != dtype or tuple(t.shape[:2]) != shape:
            raise ValueError(f"ggml bank {name}: expected {dtype} with leading shape {shape}, "
                             f"got {t.dtype} {tuple(t.shape)}")
    types = set()
    for name, tt, rows, cols in (("gate", gut[:, 0], g, hidden), ("up", gut[:, 1], u, hidden),
                                 ("down", dnt, dn, intermediate)):
        for t in torch.unique(tt).tolist():
            need = gq.row_bytes(t, cols)     # raises for unknown types and unaligned shapes
            if rows.shape[2] < need:
                raise ValueError(f"ggml bank {name}: rows of {rows.shape[2]} bytes, "
                                 f"{gq.type_name(t)} x {cols} needs {need}")
            types.add(t)
    return types


def ggml_expert_nbytes(hidden: int, intermediate: int, gate_type: int, up_type: int, down_type: int) -> int:
    """Bytes of one expert in a bank of these types (what ExpertPool.expert_nbytes will say)."""
    return (intermediate * (gq.row_bytes(gate_type, hidden) + gq.row_bytes(up_type, hidden))
            + hidden * gq.row_bytes(down_type, intermediate) + 3 * 4)
