"""What the runner hands a model for one forward pass."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..experts.base import Experts
from ..experts.pool import ExpertPool

from ..layers.attention import AttentionMetadata, KVCache


@dataclass
class ForwardContext:
    attn: AttentionMetadata
    kv: dict[int, KVCache]          # layer index -> paged KV of that attention layer
    states: list                    # per sequence in batch order: the object model.make_state() gave
    query_lens: list[int]           # new tokens per sequence in batch order (their flat tokens are contiguous)
    phase: str                      # "prefill" or "decode"


@dataclass(frozen=True)
class ModelOptions:
    """What a model is built with (the loader makes it from the resolved engine settings)."""
    device: torch.device
    dtype: torch.dtype              # storage precision: embeddings, routed experts, KV cache
    compute_dtype: torch.dtype      # activations; dense weights keep their storage dtype
    max_len: int                    # longest sequence (rotary tables)
    dense_format: str | None = None  # None keeps `dtype`; "int8": see layers/linear.py
    cpu_pool: object | None = None   # the kernels' CpuPool for dense layers (CPU only)
    # The loader's hook: the model hands over its routed-expert tensors as an ExpertPool and
    # gets the experts backend (formats applied, resident/offload/hybrid/cpu chosen) back.
    make_experts: Callable[[ExpertPool], Experts] | None = None
