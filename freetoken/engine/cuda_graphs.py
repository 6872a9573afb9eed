"""Optional CUDA graphs for decode steps (`--cuda-graphs`, off by default; issue 23 item 6).

A decode step of B sequences (one new token each) replays a graph captured once for the
smallest batch-size bucket >= B; larger batches, prefill and steps that want prompt logits run
eagerly. A graph reads and writes fixed addresses, so each bucket owns static buffers:

  ids, positions, slot_mapping   [Bb]         the new token of each row
  key_slots, key_positions       [Bb, Kmax]   each row's keys; Kmax = max_model_len rounded up
                                              to the KV block size (fixed, unlike eager steps)
  query_index, query_positions   [Bb, 1]
  logits                         [Bb, V]      the graph's output

Rows B..Bb-1 are padding: token 0 at position 0 writing its K/V into the null slot 0 (which
no real sequence reads: its key positions are masked and the paged kernel skips block 0), and
a query position of -1 (a padded query: it attends only the null slot, never NaN). Real rows
are therefore unaffected by the padding (tests/engine/test_cuda_graphs.py checks the logits
against eager decode for every batch size and bucket). The step passes no host tensors
(`context_lens` None: the paged tables derive lengths on the device).

`capture(fn, pool)` is the only CUDA-specific call: it warms `fn` up on a side stream (once
to compile and prime the allocator, once more with CUDA's sync debug mode set to "error": a
step that reads device data on the host cannot be captured, graphs are then turned off with one
warning), captures it, and returns (replay, static output). `eager_capture` is the same contract without a device: tests drive the bucket,
buffer and padding logic on the CPU with it.

What may be captured: the forward of a model whose experts are `resident` (or that has none)
and that keeps no per-sequence recurrent state. `offload` decides on the device without host
syncs, but its per-step host work (recency decay, the device table handed back at prefill and
resizes, the cache sized at the first step) would be frozen in the graph, so it is refused
with `hybrid`, `cpu` and the disk tier (`config.check_cuda_graphs`). Graphs are dropped when the KV cache
is reallocated (elastic resize): their addresses would be stale.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch

log = logging.getLogger("freetoken.engine")

PAD_POS = 1 << 30                  # key position of padding keys (never <= a query position)
Capture = Callable[[Callable[[], torch.Tensor], object], tuple[Callable[[], None], torch.Tensor]]


class GraphUnsafe(RuntimeError):
    """The decode step cannot be captured (it synchronises with the host)."""


def buckets_for(max_batch: int) -> list[int]:
    """Powers of two below max_batch, then max_batch itself: 1, 2, 4, 8, ..., N."""
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return out + [max_batch]


def cuda_capture(fn: Callable[[], torch.Tensor], pool) -> tuple[Callable[[], None], torch.Tensor]:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    mode = torch.cuda.get_sync_debug_mode()
    try:
        with torch.cuda.stream(side):
            fn()                                    # warm-up: kernels compiled, allocator primed
            torch.cuda.set_sync_debug_mode("error")
            fn()                                    # the steady step: any host sync raises here
            torch.cuda.set_sync_debug_mode(mode)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = fn()
    except RuntimeError as e:                       # a sync, or an op capture does not permit
        raise GraphUnsafe(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    finally:
        torch.cuda.set_sync_debug_mode(mode)
    return graph.replay, out


def eager_capture(fn: Callable[[], torch.Tensor], pool=None) -> tuple[Callable[[], None], torch.Tensor]:
    """The capture contract without a device: a warm-up call, then replay = run fn again into the
    same output buffer."""
    out = fn()

    def replay() -> None:
        out.copy_(fn())
    return replay, out


@dataclass
class StaticBatch:
    """One bucket's input buffers (see the module doc)."""
    ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    key_slots: torch.Tensor
    key_positions: torch.Tensor
    query_index: torch.Tensor
    query_positions: torch.Tensor

    @classmethod
    def empty(cls, rows: int, kmax: int, device) -> "StaticBatch":
        z = lambda *s: torch.zeros(s, dtype=torch.long, device=device)   # noqa: E731
        return cls(z(rows), z(rows), z(rows), z(rows, kmax), z(rows, kmax),
                   torch.arange(rows, device=device).unsqueeze(1), z(rows, 1))

    @property
    def rows(self) -> int:
        return self.ids.shape[0]

    def load(self, ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
             key_slots: torch.Tensor) -> None:
        """Host tensors of B <= rows real rows: ids/positions/slot_mapping [B], key_slots [B, k<=Kmax]
        (the slots of positions 0..positions[b]); the rest padding. One host->device copy each."""
        b, k = key_slots.shape
        kmax = self.key_slots.shape[1]
        slots = torch.zeros(self.rows, kmax, dtype=torch.long)
        slots[:b, :k] = key_slots
        kpos = torch.arange(kmax).expand(self.rows, kmax)
        lens = torch.zeros(self.rows, dtype=torch.long)
        lens[:b] = positions + 1
        qpos = torch.full((self.rows,), -1, dtype=torch.long)
        qpos[:b] = positions
        pad = lambda t: torch.cat([t, t.new_zeros(self.rows - b)])     # noqa: E731
        self.ids.copy_(pad(ids))
        self.positions.copy_(pad(positions))
        self.slot_mapping.copy_(pad(slot_mapping))
        self.key_slots.copy_(slots)
        self.key_positions.copy_(torch.where(kpos < lens[:, None], kpos, PAD_POS))
        self.query_positions.copy_(qpos.unsqueeze(1))


class DecodeGraphs:
    """Per-bucket static buffers and captured steps. `step(batch) -> logits [rows, V]` runs the
    model over a StaticBatch with fixed shapes; `capture` turns it into a replayable graph."""

    def __init__(self, step: Callable[[StaticBatch], torch.Tensor], max_batch: int, max_keys: int,
                 device: torch.device, capture: Capture = cuda_capture):
        self.step, self.device, self.capture = step, torch.device(device), capture
        self.buckets = buckets_for(max_batch)
        self.kmax = max_keys
        self.static: dict[int, StaticBatch] = {}
        self.graphs: dict[int, tuple[Callable[[], None], torch.Tensor]] = {}
        self.disabled: str | None = None
        self.replays = 0
        self._pool = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None

    def bucket(self, batch: int) -> int | None:
        return next((b for b in self.buckets if b >= batch), None)

    def run(self, ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
            key_slots: torch.Tensor) -> torch.Tensor | None:
        """Logits [B, V] of the real rows, or None when this step runs eagerly (outside the
        buckets, keys beyond Kmax, graphs turned off)."""
        bb = self.bucket(len(ids))
        if self.disabled or bb is None or key_slots.shape[1] > self.kmax:
            return None
        st = self.static.get(bb)
        if st is None:
            st = self.static[bb] = StaticBatch.empty(bb, self.kmax, self.device)
        st.load(ids, positions, slot_mapping, key_slots)
        graph = self.graphs.get(bb)
        if graph is None:
            try:
                graph = self.graphs[bb] = self.capture(lambda: self.step(st), self._pool)
            except GraphUnsafe as e:
                self.disabled = str(e)
                log.warning("cuda graphs off: the decode step synchronises with the host (%s); decoding eagerly", e)
                return None
        replay, out = graph
        replay()
        self.replays += 1
        return out[:len(ids)].clone()

    def reset(self) -> None:
        """Addresses changed (the KV cache was reallocated): capture again on next use."""
        self.graphs.clear()
        self.static.clear()
