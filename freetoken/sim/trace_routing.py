"""A loaded model's MoE layers routed as a recorded model routed them: the decode steps of one
sequence of a routing trace, in order, given to positions (position p takes step p mod S), each
of the model's MoE layers one of the trace's layers (spread evenly over its depth). The router
still runs (its cost and its top-k weights stay, largest first, on the trace's experts in its
slot order); only the ids change. What it is for: a verify of k+1 consecutive positions then
touches the union of experts the real model touched at k+1 consecutive decode steps, so a
random-weight model of the real one's expert shape prices speculation as the real one would
(`bench/speculative.py --routing-trace`). Routing depends on the position alone, so plain and
speculative decoding still agree token for token."""
from __future__ import annotations

import torch

from freetoken.engine.spec.routing import moe_layers
from freetoken.sim.trace import DECODE, Trace, TraceError


def decode_table(trace: Trace, layers: int) -> torch.Tensor:
    """[S, layers, top_k] expert ids: the longest sequence's decode steps that every picked
    trace layer recorded (one row each), `layers` trace layers spread over its depth."""
    if not 1 <= layers <= trace.num_layers:
        raise TraceError(f"{trace.name}: {layers} MoE layers to route, the trace has {trace.num_layers}")
    picked = [round(i * (trace.num_layers - 1) / max(layers - 1, 1)) for i in range(layers)]
    cells: dict[int, dict[tuple[int, int], tuple[int, ...]]] = {}
    for c in trace.cells:
        if c.phase == DECODE and len(c.rows) == 1 and len(c.rows[0]) == trace.top_k:
            cells.setdefault(c.seq, {})[(c.step, c.layer)] = c.rows[0]
    if not cells:
        raise TraceError(f"{trace.name}: no decode steps of one token with {trace.top_k} experts each")
    seq = max(cells, key=lambda s: len(cells[s]))
    steps = sorted({s for s, _ in cells[seq]})
    rows = [[cells[seq][(s, l)] for l in picked] for s in steps if all((s, l) in cells[seq] for l in picked)]
    if not rows:
        raise TraceError(f"{trace.name}: no decode step recorded all of layers {picked}")
    return torch.tensor(rows, dtype=torch.int64)


class TraceRouting:
    """Install on a loaded MoE model: its routing becomes the trace's (`remove` undoes it)."""

    def __init__(self, trace: Trace, model):
        self.layers = moe_layers(model)
        if not self.layers:
            raise TraceError(f"{trace.name}: the model has no routed-expert layers to route")
        experts, top_k = model.num_experts(), self.layers[0].top_k
        if (experts, top_k) != (trace.num_experts, trace.top_k):
            raise TraceError(f"{trace.name}: routes top-{trace.top_k} of {trace.num_experts} experts, the model "
                             f"top-{top_k} of {experts}: build the model with the trace's expert shape")
        self.table = decode_table(trace, len(self.layers))
        self.model, self.positions = model, None
        self._forward = model.forward

    def install(self) -> "TraceRouting":
        def forward(input_ids, positions, ctx):     # each forward's positions, for its MoE layers
            self.positions = positions.reshape(-1).long().cpu()
            return self._forward(input_ids, positions, ctx)
        self.model.forward = forward
        for m in self.layers:
            m.forced_routes = self.routes
        return self

    def remove(self) -> None:
        self.model.forward = self._forward
        for m in self.layers:
            m.forced_routes = None

    def routes(self, moe_layer: int, ids: torch.Tensor) -> torch.Tensor:
        pos = self.positions
        if pos is None or pos.numel() != ids.shape[0]:
            raise TraceError(f"trace routing: {ids.shape[0]} rows routed, the forward has "
                             f"{0 if pos is None else pos.numel()} positions")
        return self.table[pos % self.table.shape[0], moe_layer].to(ids.device)
