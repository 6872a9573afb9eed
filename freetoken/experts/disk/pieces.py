"""A `DiskLayout`: the expert pool described without holding it, for the disk tier
(experts/disk/backend.py, experts/disk/host_cache.py). For each bank, the shape and dtype of one expert's
row (what `ExpertPool.banks[name][flat]` would be) and the pieces of that row in the model
file, each contiguous there, so one expert is read with one `pread` per piece. Which pieces a
checkpoint format has is loading/disk_layout.py's part."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ...errors import CheckpointError
from ..memory.pool import ExpertSpec


@dataclass
class Piece:
    """One contiguous stretch of every expert's row of a bank in the file."""
    files: np.ndarray             # int32 [N]: index into DiskLayout.paths; -1: not for this expert
    offsets: np.ndarray           # int64 [N]: absolute file offset of expert `flat`'s piece
    nbytes: int                   # bytes of the piece in the file
    dst: int                      # byte offset of the piece within the bank row
    rows: int = 1                 # file rows in the piece (placed `pitch` bytes apart)
    pitch: int = 0                # 0: contiguous; else bank bytes per row (ggml rows padded)
    file_dtype: torch.dtype | None = None    # cast to the bank dtype when it differs


def elsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


@dataclass
class BankLayout:
    dtype: torch.dtype
    row_shape: tuple[int, ...]
    pieces: list[Piece]

    @property
    def row_nbytes(self) -> int:
        return int(np.prod(self.row_shape)) * torch.empty(0, dtype=self.dtype).element_size()


@dataclass
class DiskLayout:
    paths: list[Path]
    banks: dict[str, BankLayout]                   # read from the file per expert
    num_layers: int
    num_experts: int
    spec: ExpertSpec
    resident: dict[str, torch.Tensor] = field(default_factory=dict)   # [N, ...], in memory

    @property
    def expert_nbytes(self) -> int:
        return (sum(b.row_nbytes for b in self.banks.values())
                + sum(t[0].nbytes for t in self.resident.values()))

    @property
    def nbytes(self) -> int:
        """The pool's bytes as the banks hold them, each expert in its own row widths (a host
        cache slot, `expert_nbytes`, is as wide as the widest: mixed ggml types pad there)."""
        total = sum(t.nbytes for t in self.resident.values())
        for b in self.banks.values():
            for pc in b.pieces:
                each = pc.nbytes if pc.file_dtype is None else pc.nbytes // elsize(pc.file_dtype) * elsize(b.dtype)
                total += int((pc.files >= 0).sum()) * each
        return total

    @property
    def layer_expert_nbytes(self) -> np.ndarray:
        """int64 [num_layers]: one expert of each layer as the banks hold it, in its own row
        widths (what the CPU kernels stream of it; the slot is `expert_nbytes`, the widest)."""
        out = np.full(self.num_layers, sum(t[0].nbytes for t in self.resident.values()), np.int64)
        first = np.arange(self.num_layers) * self.num_experts
        for b in self.banks.values():
            for pc in b.pieces:
                each = pc.nbytes if pc.file_dtype is None else pc.nbytes // elsize(pc.file_dtype) * elsize(b.dtype)
                out += np.where(pc.files[first] >= 0, each, 0)
        return out

    def check_sizes(self) -> None:
        """Every piece inside its file (a truncated file is refused at start, in one line)."""
        sizes = [p.stat().st_size for p in self.paths]
        for name, b in self.banks.items():
            for pc in b.pieces:
                end = pc.offsets + pc.nbytes
                for i, size in enumerate(sizes):
                    sel = pc.files == i
                    if sel.any() and int(end[sel].max()) > size:
                        flat = int(np.flatnonzero(sel & (end > size))[0])
                        raise CheckpointError(
                            f"{self.paths[i]}: truncated: expert {flat % self.num_experts} of MoE layer "
                            f"{flat // self.num_experts} (bank {name!r}) needs bytes up to {int(end[flat])} "
                            f"but the file has {size}")
