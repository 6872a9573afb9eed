"""Replay semantics: turn a trace into the ordered stream of cache accesses.

Per sequence, in order of first appearance:
- prefill, layer by layer (ascending): the union of the experts any prompt token routed
  at that layer is accessed once each, in ascending expert id;
- decode, cell by cell in execution order (token by token, layers in order): the cell's
  routed set (the union of its rows when a step batched several tokens) is accessed
  once each, in ascending id.
A key is ``layer * num_experts + expert``. Only decode accesses are counted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from freetoken.sim.trace import DECODE, PREFILL, Trace


@dataclass(frozen=True)
class Segment:
    phase: str
    cells: tuple[tuple[int, ...], ...]  # each: one (step, layer)'s keys, ascending
    layers: tuple[int, ...]  # the layer of each cell
    prompt_counts: Counter | None = None  # prefill only: key -> number of prompt tokens routing it
    token_counts: tuple[tuple[int, ...], ...] | None = None  # in-order streams: tokens routing each cell key
    rows: tuple[tuple[tuple[int, ...], ...], ...] | None = None  # prefill: each cell's per-token expert ids

    def keys(self) -> list[int]:
        return [k for cell in self.cells for k in cell]


@dataclass(frozen=True)
class AccessStream:
    num_layers: int
    num_experts: int
    segments: tuple[Segment, ...]

    @property
    def universe(self) -> int:
        return self.num_layers * self.num_experts

    def decode_accesses(self) -> int:
        return sum(len(c) for s in self.segments if s.phase == DECODE for c in s.cells)


def build_stream(trace: Trace, in_order: bool = False) -> AccessStream:
    """in_order: replay the cells exactly as recorded, each prefill cell on its own (an engine
    trace of batched steps, where prompts start between other sequences' decode steps)."""
    E = trace.num_experts
    if in_order:
        return _in_order(trace)
    order: list[int] = []
    for c in trace.cells:
        if c.seq not in order:
            order.append(c.seq)
    segments: list[Segment] = []
    for seq in order:
        mine = [c for c in trace.cells if c.seq == seq]
        prompt = [c for c in mine if c.phase == PREFILL]
        if prompt:
            union: dict[int, set[int]] = {}
            rows: dict[int, list] = {}
            counts: Counter = Counter()
            for c in prompt:
                rows.setdefault(c.layer, []).extend(c.rows)
                for row in c.rows:
                    union.setdefault(c.layer, set()).update(row)
                    counts.update(c.layer * E + e for e in set(row))
            layers = sorted(union)
            cells = tuple(tuple(l * E + e for e in sorted(union[l])) for l in layers)
            segments.append(Segment(PREFILL, cells, tuple(layers), counts,
                                    rows=tuple(tuple(rows[l]) for l in layers)))
        decode = [c for c in mine if c.phase == DECODE]
        if decode:
            cells = tuple(tuple(c.layer * E + e for e in c.experts()) for c in decode)
            segments.append(Segment(DECODE, cells, tuple(c.layer for c in decode)))
    return AccessStream(trace.num_layers, E, tuple(segments))


def _in_order(trace: Trace) -> AccessStream:
    E = trace.num_experts
    segments: list[Segment] = []
    run: list = []
    for i, c in enumerate(trace.cells):
        run.append(c)
        nxt = trace.cells[i + 1] if i + 1 < len(trace.cells) else None
        if nxt is None or nxt.phase != c.phase:
            per_cell = [Counter(x.layer * E + e for row in x.rows for e in set(row)) for x in run]
            cells = tuple(tuple(sorted(n)) for n in per_cell)
            tokens = tuple(tuple(n[k] for k in cell) for n, cell in zip(per_cell, cells))
            counts = sum(per_cell, Counter()) if c.phase == PREFILL else None
            rows = tuple(tuple(x.rows) for x in run) if c.phase == PREFILL else None
            segments.append(Segment(c.phase, cells, tuple(x.layer for x in run), counts, tokens, rows))
            run = []
    return AccessStream(trace.num_layers, E, tuple(segments))


def stream_from_keys(num_layers: int, num_experts: int, segments: list[tuple[str, list[list[int]]]]) -> AccessStream:
    """Build a stream directly from (phase, [cell keys]) pairs: for tests and synthetic traces."""
    out = []
    for phase, cells in segments:
        cells_t = tuple(tuple(c) for c in cells)
        layers = tuple((c[0] // num_experts) if c else 0 for c in cells_t)
        counts = Counter(k for c in cells_t for k in c) if phase == PREFILL else None
        out.append(Segment(phase, cells_t, layers, counts))
    return AccessStream(num_layers, num_experts, tuple(out))
