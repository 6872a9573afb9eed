"""What a model keeps per token and per sequence, from its config alone: the paged-KV rows of
each layer and the per-sequence states (sliding windows, compressed entries, recurrent state).
Each model class answers it (`MoECausalLM.cache_spec`) with the same code its own allocation
runs -- the states are built on the `meta` device and measured -- so the memory plan,
`sim sessions` and the engine cannot drift apart."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.choices import activation_dtype
from ..layers.attention.paged import kv_values_per_token
from ..layers.host_copy import ALIGN as HOST_ALIGN
from ..platform import cpu_flags
from .registry import model_class


@dataclass(frozen=True)
class CacheSpec:
    kv_layers: tuple[tuple, ...]     # as `kv_layers()`: (layer, kv heads, head dim[, values])
    kv_dtype: torch.dtype
    state_bytes: int                 # one sequence's states, allocated for max_len tokens
    snapshot_parts: tuple[int, ...] = ()   # bytes of each state part's snapshot buffer (one buffer a part)

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_values_per_token(list(self.kv_layers)) * self.kv_dtype.itemsize

    @property
    def kind(self) -> str:
        return "hybrid" if self.state_bytes else "full attention"


def snapshot_part_bytes(state) -> tuple[int, ...]:
    """The host buffer each part of a state snapshot takes (`layers/host_copy.to_host`: one
    buffer per part, its tensors 64-byte aligned in it)."""
    if state is None:
        return ()
    return tuple(sum(-(-v.nbytes // HOST_ALIGN) * HOST_ALIGN for v in vars(p).values() if isinstance(v, torch.Tensor))
                 for p in state.parts.values())


def allocated_bytes(state) -> int:
    """Bytes of every tensor a state object holds (whole buffers, not just the filled part)."""
    if state is None:
        return 0
    parts = getattr(state, "parts", None)
    if parts is not None:
        return sum(allocated_bytes(p) for p in parts.values())
    return sum(v.nbytes for v in vars(state).values() if isinstance(v, torch.Tensor))


def cache_spec_for(config: dict, path, max_len: int, kv_dtype: torch.dtype, device: torch.device,
                   compute_dtype: str = "auto") -> CacheSpec:
    """The spec of the model class `config` names, with the activation dtype the engine picks
    on `device` (states that keep activations use it)."""
    act = activation_dtype(kv_dtype, device, compute_dtype, kernels=device.type == "cpu", flags=cpu_flags())
    return model_class(config, path).cache_spec(config, path, max_len, kv_dtype, act)
