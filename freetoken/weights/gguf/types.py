"""The ggml tensor types a GGUF stores, as far as reading them needs: the float type ids and
`dequantize` (raw GGUF bytes of any type to a torch tensor)."""
from __future__ import annotations

import numpy as np
import torch

from ...quant import ggml_quants

F32, F16, BF16 = 0, 1, 30            # ggml type ids of the float types
I8, I16, I32 = 24, 25, 26             # integer tensors (DeepSeek-V4's token -> expert table is I32)
FLOAT_TYPES = {F32: np.float32, F16: np.float16, I8: np.int8, I16: np.int16, I32: np.int32}


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...], owned: bool = False) -> torch.Tensor:
    """float32 (F32/F16/I8/I16/I32: their own dtype, BF16: bfloat16) tensor of `shape` from raw GGUF bytes;
    `owned`: raw is the caller's own writable array (float types then use it without a copy)."""
    own = (lambda a: a) if owned else np.copy
    if ggml_type in FLOAT_TYPES:
        return torch.from_numpy(own(raw.view(FLOAT_TYPES[ggml_type]).reshape(shape)))
    if ggml_type == BF16:
        return torch.from_numpy(own(raw)).view(torch.bfloat16).reshape(shape)
    if ggml_type in ggml_quants.NAMES:      # torch, bit-exact to gguf.quants
        return ggml_quants.dequantize(torch.from_numpy(own(raw)), ggml_type, shape[-1]).reshape(shape)
    import gguf                             # the rarer types: the package's numpy reference
    out = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(ggml_type))
    return torch.as_tensor(np.asarray(out, dtype=np.float32)).reshape(shape)
