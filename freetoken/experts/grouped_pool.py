"""An expert pool whose MoE layers do not all have the same bank row shapes.

llama.cpp's Q4_K_M stores `ffn_down_exps` as Q6_K in some layers and Q4_K in the others, so
a "ggml" down row is 630 bytes in one layer and 432 in the next (Qwen3-30B-A3B). One bank of
the widest rows would pad every Q4_K row (7% of the pool there). Instead the layers are
grouped by row width: each group is an ordinary `ExpertPool` over its own layers (its flat id
`local layer * E + expert`), so its banks are dense and every executor runs on it unchanged.
The model still addresses experts by the global flat id `layer * E + expert`; this class maps
it to (group, group flat id).

What stays sized to the widest group: a cache slot (`slot_rows`, `expert_nbytes`: each bank's
widest row), since a slot holds any layer's expert; a narrower expert fills the front of each slot row (the
kernels read only its type's row bytes, the types ride along in the slot).
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

from .memory import pinning
from .memory.pool import ExpertPool


class GroupedPool:
    def __init__(self, groups: list[ExpertPool], layers: list[list[int]]):
        if len(groups) != len(layers) or not groups:
            raise ValueError("a grouped pool needs one list of layers per group")
        E, spec = groups[0].num_experts, groups[0].spec
        L = sum(len(ls) for ls in layers)
        if sorted(m for ls in layers for m in ls) != list(range(L)):
            raise ValueError(f"the groups' layers must cover layers 0..{L - 1} once each")
        for g, ls in zip(groups, layers):
            if g.num_experts != E or g.spec != spec or g.num_layers != len(ls) or set(g.banks) != set(groups[0].banks):
                raise ValueError("every group needs the same experts per layer, spec and bank names")
        self._groups, self.group_layers = groups, [list(ls) for ls in layers]
        self.num_layers, self.num_experts, self.spec = L, E, spec
        self._group = np.empty(L, np.int64)
        self._local = np.empty(L, np.int64)
        for gi, ls in enumerate(layers):
            self._group[ls], self._local[ls] = gi, np.arange(len(ls))
        experts = np.arange(E)
        # per global flat id: its group and its flat id there (host arrays and tensors)
        self.group_of = np.repeat(self._group, E)
        self.local_of = (self._local[:, None] * E + experts[None, :]).reshape(-1)
        self._group_t = torch.from_numpy(self.group_of)
        self._local_t = torch.from_numpy(self.local_of)
        # per layer as Python ints: its group, and the shift from a global flat id to the group's
        # (a decode call's ids are one layer's: one add, no numpy round trip)
        self._layer_group = self._group.tolist()
        self._layer_shift = ((self._local - np.arange(L)) * E).tolist()
        self._pins = pinning.PinnedBanks()

    @property
    def groups(self) -> list[ExpertPool]:
        return self._groups

    def flat_ids(self, layer: int, expert_ids: torch.Tensor) -> torch.Tensor:
        return expert_ids + layer * self.num_experts

    def layer_group(self, layer: int) -> tuple[int, int]:
        return int(self._group[layer]), int(self._local[layer])

    def split_ids(self, flat_ids: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        ids = flat_ids if flat_ids.dtype == torch.int64 else flat_ids.long()
        if ids.device.type == "cpu" and ids.numel() <= 64 and (one := self._one_layer(ids)) is not None:
            return [one]
        if ids.device.type == "cpu":          # numpy: a call's many ids cost microseconds
            a = ids.numpy()
            valid = a >= 0
            safe = np.maximum(a, 0)
            g, local = self.group_of[safe], self.local_of[safe]
            used = g[valid]
            if used.size and used.min() == used.max():      # one layer's call: one group
                return [(int(used[0]), torch.from_numpy(np.where(valid, local, -1)))]
            return [(int(gi), torch.from_numpy(np.where(valid & (g == gi), local, -1))) for gi in np.unique(used)]
        valid = ids >= 0
        safe = ids.clamp_min(0)
        g = self._group_t.to(ids.device)[safe]
        local = self._local_t.to(ids.device)[safe]
        return [(gi, torch.where(valid & (g == gi), local, -1)) for gi in torch.unique(g[valid]).tolist()]

    def _one_layer(self, ids: torch.Tensor) -> tuple[int, torch.Tensor] | None:
        """(group, group flat ids; < 0 kept -1) when the valid ids of `ids` are all one layer's
        (a decode or verify call); else None. Python ints: ~10 numpy calls fewer per layer."""
        flat = ids.reshape(-1).tolist()
        valid = [i for i in flat if i >= 0]
        if not valid:
            return None
        E = self.num_experts
        layer = min(valid) // E
        if max(valid) // E != layer or layer >= self.num_layers:
            return None
        local = ids + self._layer_shift[layer]
        return self._layer_group[layer], local if len(valid) == len(flat) else torch.where(ids >= 0, local, -1)

    @functools.cached_property
    def expert_nbytes(self) -> int:
        """Bytes of a cache slot (`slot_rows`: each bank as wide as its widest group, so a mix whose
        widest gate_up and widest down are in different layers counts both); each group's own
        expert bytes: groups[i].expert_nbytes."""
        return sum(math.prod(shape) * torch.empty((), dtype=dt).element_size()
                   for shape, dt in self.slot_rows().values())

    @property
    def nbytes(self) -> int:
        return sum(g.nbytes for g in self._groups)

    @functools.cached_property
    def layer_expert_nbytes(self) -> np.ndarray:
        """int64 [num_layers]: each layer's expert bytes in its own group's widths."""
        return np.array([self._groups[g].expert_nbytes for g in self._group], np.int64)

    def flat_nbytes(self, flat_ids) -> int:
        """The real bytes of these experts (what a fill copies: a narrower one fills only the
        front of its slot's rows), not the slot's."""
        return int(self.layer_expert_nbytes[np.asarray(flat_ids, np.int64) // self.num_experts].sum())

    def slot_rows(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        rows = [g.slot_rows() for g in self._groups]
        out = {}
        for k, (shape, dtype) in rows[0].items():
            shapes = [r[k][0] for r in rows]
            if any(s[:-1] != shape[:-1] or r[k][1] != dtype for s, r in zip(shapes, rows)):
                raise ValueError(f"expert bank {k!r}: groups differ in more than the row width: {shapes}")
            out[k] = ((*shape[:-1], max(s[-1] for s in shapes)) if shape else shape, dtype)
        return out

    def fill_pairs(self, dst: dict[str, torch.Tensor], slots, flat_ids) -> list[tuple[torch.Tensor, torch.Tensor]]:
        pairs = []
        for s, f in zip(slots, flat_ids):
            g = self._groups[self.group_of[f]]
            lf = int(self.local_of[f])
            for k, d in dst.items():
                src, row = g.banks[k][lf], d[s]
                if row.shape != src.shape:                 # a narrower group: the front of each row
                    row = row[..., :src.shape[-1]]
                pairs.append((row, src))
        return pairs

    def all_banks(self) -> list[torch.Tensor]:
        return [b for g in self._groups for b in g.banks.values()]

    def pin(self, register=None, unregister=None, limit: int | None = -1) -> int:
        """As ExpertPool.pin, over every group's banks at once (all or nothing)."""
        banks = {f"{i}.{k}": b for i, g in enumerate(self._groups) for k, b in g.banks.items()}
        return self._pins.pin(banks, register, unregister, limit)

    def unpin(self) -> None:
        self._pins.unpin()

    @property
    def pinned_bytes(self) -> int:
        return self._pins.nbytes
