"""Small constant tensors (shift amounts, lookup tables, grids) made once per device.

The dequantizers run on the device path (the GPU's cache slots) too: a `torch.tensor(list,
device=cuda)` per call is a blocking host->device copy ordered behind the queued work (a
hidden synchronisation, and not capturable in a CUDA graph). Each constant is built on the
first call per device and reused; callers never write into it."""
from __future__ import annotations

import functools

import numpy as np
import torch


@functools.lru_cache(maxsize=512)
def _made(values: tuple, dtype: torch.dtype, device: str) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


def const(values, dtype: torch.dtype, device) -> torch.Tensor:
    """The 1-D tensor of `values` (a tuple of numbers) on `device`, built once."""
    return _made(tuple(values), dtype, str(torch.device(device)))


_ARRAYS: dict[tuple[str, str], torch.Tensor] = {}


def array_const(key: str, make, device) -> torch.Tensor:
    """The tensor of the numpy array `make()` (named `key`: one array per key) on `device`, built once."""
    at = (key, str(torch.device(device)))
    t = _ARRAYS.get(at)
    if t is None:
        t = _ARRAYS[at] = torch.from_numpy(np.ascontiguousarray(make())).to(at[1])
    return t
