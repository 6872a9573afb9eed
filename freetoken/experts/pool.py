"""The host expert pool: every routed expert of the model, in banks whose leading index
is the flat id `moe_layer * num_experts + expert`. Rows with the same index across banks
form one complete expert. This is the source of truth; caches only copy from it.
Bank layouts per format: `formats.py`.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from .formats import quantize_banks, spec_format
from . import pinning


@dataclass(frozen=True)
class ExpertSpec:
    """What an expert computes: down(act(gate(x)) * up(x)) with this activation."""
    hidden: int
    intermediate: int
    fmt: str = "float"              # float | mxfp4 | fp8 | int8 | nvfp4 | ggml
    activation: str = "silu"        # silu | swiglu_oai (gpt-oss clamped SwiGLU) | silu_clamp (DeepSeek-V4)
    alpha: float = 1.702
    limit: float = 7.0


class ExpertPool:
    def __init__(self, banks: dict[str, torch.Tensor], num_layers: int, num_experts: int, spec: ExpertSpec):
        n = num_layers * num_experts
        for name, bank in banks.items():
            if bank.shape[0] != n:
                raise ValueError(f"expert bank {name!r} has {bank.shape[0]} rows, expected {n}")
        self.banks, self.num_layers, self.num_experts, self.spec = banks, num_layers, num_experts, spec
        self.pinned_bytes = 0           # page-locked in place (pin), part of nbytes, never a copy
        self._registered: list[torch.Tensor] = []
        self._unregister = None

    def flat_ids(self, layer: int, expert_ids: torch.Tensor) -> torch.Tensor:
        return expert_ids + layer * self.num_experts

    @functools.cached_property
    def expert_nbytes(self) -> int:
        """Bytes of one complete expert across all banks (banks are fixed once built)."""
        return sum(b[0].nbytes for b in self.banks.values())

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.banks.values())

    def rows(self, flat_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        return {k: b.index_select(0, flat_ids) for k, b in self.banks.items()}

    def pin(self, register=None, unregister=None, limit: int | None = -1) -> int:
        """Page-lock the filled banks in place (experts/pinning.py): no second copy. Returns the
        pinned bytes; raises PinError (banks left pageable) when refused or over `limit` (-1:
        the process's `ulimit -l`). register/unregister default to cudaHostRegister/Unregister."""
        if self.pinned_bytes:
            return self.pinned_bytes
        register = register or pinning.cuda_register
        unregister = unregister or pinning.cuda_unregister
        limit = pinning.memlock_limit() if limit == -1 else limit
        self._registered = pinning.pin_banks(self.banks, register, unregister, limit)
        self._unregister = unregister
        self.pinned_bytes = sum(b.untyped_storage().nbytes() for b in self._registered)
        return self.pinned_bytes

    def unpin(self) -> None:
        for b in self._registered:
            self._unregister(b)
        self._registered, self.pinned_bytes = [], 0


class PoolBuilder:
    """Fills exactly-sized banks expert by expert, straight into their final layout."""

    def __init__(self, num_layers: int, num_experts: int, spec: ExpertSpec):
        self.num_layers, self.num_experts, self.spec = num_layers, num_experts, spec
        self.banks: dict[str, torch.Tensor] = {}

    def put(self, bank: str, layer: int, expert: int, value: torch.Tensor, dtype: torch.dtype) -> None:
        b = self.banks.get(bank)
        if b is None:
            n = self.num_layers * self.num_experts
            b = self.banks[bank] = torch.empty((n, *value.shape), dtype=dtype)
        b[layer * self.num_experts + expert].copy_(value)

    def put_layer(self, bank: str, layer: int, value: torch.Tensor, dtype: torch.dtype) -> None:
        """All experts of one layer at once: value [E, ...]."""
        b = self.banks.get(bank)
        if b is None:
            n = self.num_layers * self.num_experts
            b = self.banks[bank] = torch.empty((n, *value.shape[1:]), dtype=dtype)
        b[layer * self.num_experts:(layer + 1) * self.num_experts].copy_(value)

    def build(self) -> ExpertPool:
        return ExpertPool(self.banks, self.num_layers, self.num_experts, self.spec)


def requantize(pool: ExpertPool, fmt: str) -> ExpertPool:
    """The float pool re-encoded in `fmt` (int8 | fp8 | mxfp4 | bf16 | fp16 | fp32); biases kept.
    Lets a bf16 checkpoint run with 8-bit or 4-bit experts without a converted checkpoint."""
    if pool.spec.fmt != "float":
        raise ValueError(f"expert_format: the checkpoint's experts are already {pool.spec.fmt}; "
                         "only float experts can be re-encoded")
    banks = quantize_banks(pool.banks["gate_up"], pool.banks["down"], fmt)
    banks.update({k: v for k, v in pool.banks.items() if k.endswith("_bias")})
    spec = replace(pool.spec, fmt=spec_format(fmt))
    return ExpertPool(banks, pool.num_layers, pool.num_experts, spec)
