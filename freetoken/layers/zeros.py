"""Zero-filled host tensors whose pages are zeroed by the kernel on first use, not at start.

`torch.zeros` writes every byte up front; for a KV pool of many GiB that is seconds of page
faults and memset before the first token (anonymous page faults run at ~0.5 GB/s on some
VMs). A fresh anonymous mapping already reads as zeros, and each page costs only when a
block is first written. Small tensors and other devices use torch.zeros."""
from __future__ import annotations

import math
import mmap

import torch

LAZY_MIN_BYTES = 64 << 10


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if torch.device(device).type != "cpu" or nbytes < LAZY_MIN_BYTES:
        return torch.zeros(shape, dtype=dtype, device=device)
    buf = mmap.mmap(-1, nbytes)          # MAP_PRIVATE|MAP_ANONYMOUS: zero pages, faulted in lazily
    return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).view(shape)
