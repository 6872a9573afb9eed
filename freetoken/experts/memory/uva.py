"""Device-side reads of the pinned host pool: the fills of the device decision path.

Decode decisions made on the device (device_plan.py) know which pool rows to copy only on the
device. Instead of bringing that list to the host, the device gathers the rows itself: under
CUDA's unified virtual addressing a page-locked host buffer is addressable from kernels at its
host pointer, so a CUDA tensor over that pointer (built through `__cuda_array_interface__`)
lets `index_select` read pool rows over the link (zero-copy). Banks are viewed as bytes
[N, row bytes] (the interface has no bf16 type code); on a CPU "device" the bank itself is used.
Written for CUDA, not yet run on a GPU (docs/expert-memory.md)."""
from __future__ import annotations

import torch


class _HostRows:
    def __init__(self, t: torch.Tensor):
        self.t = t            # keeps the host buffer alive as long as the view
        n = t.shape[0]
        self.__cuda_array_interface__ = {"shape": (n, t[0].nbytes if n else 0), "typestr": "|u1",
                                         "data": (t.data_ptr(), False), "version": 3, "strides": None}


def byte_rows(t: torch.Tensor) -> torch.Tensor:
    """[N, ...] contiguous -> uint8 [N, row bytes] over the same memory."""
    return t.contiguous().view(torch.uint8).reshape(t.shape[0], -1)


def device_rows(bank: torch.Tensor, device: torch.device) -> torch.Tensor:
    """uint8 [N, row bytes] of a host bank, readable by work on `device`."""
    device = torch.device(device)
    if device.type == "cpu" or bank.device == device:
        return byte_rows(bank)
    if device.type != "cuda" or not bank.is_pinned() or not bank.is_contiguous():
        raise ValueError("device-side fills need the pool banks contiguous and pinned (page-locked) for CUDA")
    return torch.as_tensor(_HostRows(bank), device=device)
