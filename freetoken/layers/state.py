"""Per-sequence state that is not a plain append-only KV cache.

A state object knows how many tokens it has absorbed (`position`) and can
`snapshot()` itself into a detached copy and `restore()` from one (both work inside or
outside inference mode: the runner creates states under it). The prefix
cache stores snapshots; models only read and write the live tensors. Snapshots live in host
memory whatever the live device (pinned and copied asynchronously from a GPU: host_copy.py);
`restore` copies them back to the live tensors' device.
"""

import copy
from dataclasses import dataclass, field

import torch

from .host_copy import to_host


class TensorState:
    """A state made of fixed-shape tensors (named in `tensors`) plus an absorbed `position`."""

    tensors: tuple[str, ...] = ()
    position: int = 0

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, t).nbytes for t in self.tensors)

    @torch.inference_mode()
    def snapshot(self):
        snap = copy.copy(self)
        snap.host = to_host([getattr(self, t) for t in self.tensors])
        for t, host in zip(self.tensors, snap.host.tensors):
            setattr(snap, t, host)
        return snap

    @torch.inference_mode()
    def restore(self, snap) -> None:
        live = [getattr(self, t) for t in self.tensors]
        if getattr(snap, "host", None) is not None:
            snap.host.copy_back(live)
        else:                                   # another live state
            for dst, t in zip(live, self.tensors):
                dst.copy_(getattr(snap, t))
        self.position = snap.position

    @torch.inference_mode()
    def reset(self) -> None:
        for t in self.tensors:
            getattr(self, t).zero_()
        self.position = 0


class DeltaNetState(TensorState):
    """Conv and recurrent state of every gated-DeltaNet layer of one sequence.

    conv [L, C, K-1] in the model dtype, recurrent [L, Hv, Dk, Dv] in fp32."""

    def __init__(self, num_layers: int, conv_shape, rec_shape, dtype=torch.float32, device="cpu"):
        self.conv = torch.zeros(num_layers, *conv_shape, dtype=dtype, device=device)
        self.rec = torch.zeros(num_layers, *rec_shape, dtype=torch.float32, device=device)
        self.position = 0

    tensors = ("conv", "rec")


class SlidingWindowKV(TensorState):
    """The last `window` keys and values of each sliding-window layer of one sequence,
    as a ring buffer: token at absolute position p lives in slot p % window.

    k, v [L, window, Hkv, D]; `values=False` keeps k only (DeepSeek-V4: keys are the values)."""

    def __init__(self, num_layers: int, window: int, kv_heads: int, head_dim: int,
                 dtype=torch.float32, device="cpu", values: bool = True):
        self.window = window
        self.k = torch.zeros(num_layers, window, kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k) if values else None
        self.tensors = ("k", "v") if values else ("k",)
        self.position = 0

    tensors = ("k", "v")

    def reset(self) -> None:
        self.position = 0          # stale slots are never read: `cached` looks back from `position` only

    def cached(self, layer: int, start: int):
        """Keys/values of positions [max(0, start - window), start), oldest first,
        with their absolute positions; `start` must equal the absorbed position."""
        lo = max(0, start - self.window)
        pos = torch.arange(lo, start)
        slots = pos % self.window
        return self.k[layer, slots], self.v[layer, slots] if self.v is not None else None, pos

    @torch.inference_mode()
    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store keys/values [T, Hkv, D] of positions start..start+T (keeps the last window)."""
        t = k.shape[0]
        keep = min(t, self.window)
        pos = torch.arange(start + t - keep, start + t)
        self.k[layer, pos % self.window] = k[t - keep:].to(self.k.dtype)
        if self.v is not None:
            self.v[layer, pos % self.window] = v[t - keep:].to(self.v.dtype)


@dataclass
class SequenceState:
    """All non-KV state of one sequence, by name; snapshots as a unit."""

    parts: dict = field(default_factory=dict)

    @property
    def position(self) -> int:
        return min((p.position for p in self.parts.values()), default=0)

    def advance(self, n: int) -> None:
        for p in self.parts.values():
            p.position += n

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts.values())

    def snapshot(self) -> "SequenceState":
        return SequenceState({name: p.snapshot() for name, p in self.parts.items()})

    def restore(self, snap: "SequenceState") -> None:
        for name, p in self.parts.items():
            p.restore(snap.parts[name])

    def reset(self) -> None:
        for p in self.parts.values():
            p.reset()


def check_positions(states, query_lens, positions: torch.Tensor) -> None:
    """Each sequence's step must start where its state stopped (no silent prefix skips)."""
    start = 0
    for st, n in zip(states, query_lens):
        if n and int(positions[start]) != st.position:
            raise RuntimeError(f"sequence state is at position {st.position} but the step starts at "
                               f"{int(positions[start])}: restore a snapshot or recompute from 0")
        start += n
