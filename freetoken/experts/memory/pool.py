"""The host expert pool: every routed expert of the model, in banks whose leading index
is the flat id `moe_layer * num_experts + expert`. Rows with the same index across banks
form one complete expert. This is the source of truth; caches only copy from it.
Bank layouts per format: `formats.py`. A model whose MoE layers hold rows of different widths
(GGUF Q4_K_M: ffn_down Q6_K in some layers, Q4_K in the others) gets a `GroupedPool` instead
(grouped_pool.py): one such pool per row width, no padding; both answer the group methods below.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..formats import quantize_banks, spec_format
from ...kernels.huge_pages import huge_empty
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
        self._pins = pinning.PinnedBanks()

    def flat_ids(self, layer: int, expert_ids: torch.Tensor) -> torch.Tensor:
        return expert_ids + layer * self.num_experts

    @functools.cached_property
    def expert_nbytes(self) -> int:
        """Bytes of one complete expert across all banks (banks are fixed once built)."""
        return sum(b[0].nbytes for b in self.banks.values())

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.banks.values())

    @functools.cached_property
    def layer_expert_nbytes(self) -> np.ndarray:
        """int64 [num_layers]: the bytes of one expert of each MoE layer (one width here; a
        GroupedPool's differ by group, and a cache slot is as wide as the widest)."""
        return np.full(self.num_layers, self.expert_nbytes, np.int64)

    def flat_nbytes(self, flat_ids) -> int:
        """The real bytes of these experts (each at its own layer's width): what a fill copies."""
        return int(self.layer_expert_nbytes[np.asarray(flat_ids, np.int64) // self.num_experts].sum())

    def rows(self, flat_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        return {k: b.index_select(0, flat_ids) for k, b in self.banks.items()}

    # ---- the group methods (a GroupedPool has several groups; this pool is its own only one) ----
    @property
    def groups(self) -> list["ExpertPool"]:
        return [self]

    def layer_group(self, layer: int) -> tuple[int, int]:
        """(group, the layer's index inside that group's pool)."""
        return 0, layer

    def split_ids(self, flat_ids: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """[(group, the ids as that group's flat ids, -1 where another group's)] for the groups used."""
        return [(0, flat_ids)]

    def slot_rows(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Per bank, the row shape and dtype of a cache slot that can hold any expert."""
        return {k: (tuple(b.shape[1:]), b.dtype) for k, b in self.banks.items()}

    def fill_pairs(self, dst: dict[str, torch.Tensor], slots, flat_ids) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(slot row, pool row) copies that put experts `flat_ids` into slots `slots` of `dst`."""
        pairs = []
        for k, d in dst.items():
            src = self.banks[k]
            pairs += [(d[s], src[f]) for s, f in zip(slots, flat_ids)]
        return pairs

    def all_banks(self) -> list[torch.Tensor]:
        return list(self.banks.values())

    def pin(self, register=None, unregister=None, limit: int | None = -1) -> int:
        """Page-lock the filled banks in place (experts/memory/pinning.py): no second copy. Returns the
        pinned bytes; raises PinError (banks left pageable) when refused or over `limit` (-1:
        the process's `ulimit -l`). register/unregister default to cudaHostRegister/Unregister."""
        return self._pins.pin(self.banks, register, unregister, limit)

    def unpin(self) -> None:
        self._pins.unpin()

    @property
    def pinned_bytes(self) -> int:
        """Bytes page-locked in place (pin), part of nbytes, never a copy."""
        return self._pins.nbytes


class PoolBuilder:
    """Fills exactly-sized banks expert by expert, straight into their final layout."""

    def __init__(self, num_layers: int, num_experts: int, spec: ExpertSpec):
        self.num_layers, self.num_experts, self.spec = num_layers, num_experts, spec
        self.banks: dict[str, torch.Tensor] = {}

    def put(self, bank: str, layer: int, expert: int, value: torch.Tensor, dtype: torch.dtype) -> None:
        b = self.banks.get(bank)
        if b is None:
            n = self.num_layers * self.num_experts
            b = self.banks[bank] = huge_empty((n, *value.shape), dtype)
        b[layer * self.num_experts + expert].copy_(value)

    def put_layer(self, bank: str, layer: int, value: torch.Tensor, dtype: torch.dtype) -> None:
        """All experts of one layer at once: value [E, ...]."""
        b = self.banks.get(bank)
        if b is None:
            n = self.num_layers * self.num_experts
            b = self.banks[bank] = huge_empty((n, *value.shape[1:]), dtype)
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
