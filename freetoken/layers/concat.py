"""Concatenation that costs nothing when the parts already lie back to back.

An FTW file stores dense tensors in the order the model asks for them, 4 KiB-aligned, and is
loaded as one mapping: q, k and v (or gate and up) of a layer are usually adjacent there, so
the fused weight is a view of the file's pages instead of fresh memory to fault in and copy."""
from __future__ import annotations

import torch


def cat_rows(parts: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat(parts) along dim 0; a view when the parts are contiguous, same dtype/device
    and consecutive in one storage."""
    first = parts[0]
    adjacent = all(p.is_contiguous() and p.dtype == first.dtype and p.device == first.device
                   and p.shape[1:] == first.shape[1:] for p in parts) and all(
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        and a.data_ptr() + a.nbytes == b.data_ptr() for a, b in zip(parts, parts[1:]))
    if not adjacent or len(parts) < 2:
        return torch.cat(parts)
    rows = sum(p.shape[0] for p in parts)
    return first.as_strided((rows, *first.shape[1:]), first.stride())
