"""Mixtral traces written by a vLLM hook (Mario928/speculative-moe).

Two layouts. ``token_pos`` files (``routing_raw.jsonl``) hold every forward call in
execution order: a prefill call is, per layer, a run of records over prompt
positions; a decode call is one record per layer. ``token_idx`` files are
decode-only, layer-major, with a per-layer running counter. The collector dropped
records whose weights were exactly [0.5, 0.5]; those cells are reported, not invented.
"""

from __future__ import annotations

from pathlib import Path

from freetoken.sim.readers.common import id_list, int_field, json_lines, missing_decode_cells
from freetoken.sim.trace import DECODE, PREFILL, Cell, Trace, TraceError

TOP_K = 2


def _records(path: Path, step_field: str):
    out = []
    for where, r in json_lines(path):
        out.append(
            (
                r.get("dataset", ""),
                int_field(r, "problem_id", where) if "problem_id" in r else 0,
                int_field(r, "layer", where),
                int_field(r, step_field, where),
                id_list(r.get("experts"), "experts", where),
            )
        )
    if not out:
        raise TraceError(f"{path}: no records")
    return out


def _shape(path: Path, records) -> tuple[int, int]:
    num_layers = max(r[2] for r in records) + 1
    num_experts = max(e for r in records for e in r[4]) + 1
    return num_layers, num_experts


def _model(path: Path) -> str:
    return path.parent.name or "unknown"


def read_vllm_raw(path) -> Trace:
    """``token_pos`` layout: a new forward call starts where (layer, position) stops increasing."""
    path = Path(path)
    records = _records(path, "token_pos")
    num_layers, num_experts = _shape(path, records)
    seq_of: dict[tuple, int] = {}
    calls: list[list[tuple]] = []
    prev = None
    for rec in records:
        problem = rec[:2]
        seq_of.setdefault(problem, len(seq_of))
        # a call runs layers upward; within a layer, positions upward
        if prev is None or problem != prev[:2] or (rec[2], rec[3]) <= (prev[2], prev[3]):
            calls.append([])
        calls[-1].append(rec)
        prev = rec
    cells: list[Cell] = []
    missing: list[tuple[int, str, int, int]] = []
    position: dict[int, int] = {}
    for call in calls:
        seq = seq_of[call[0][:2]]
        tokens = max(r[3] for r in call) + 1
        if tokens > 1:  # a prefill call
            start = position.get(seq, 0)
            seen = {(r[2], r[3]) for r in call}
            for rec in sorted(call, key=lambda r: (r[2], r[3])):
                cells.append(Cell(seq, PREFILL, start + rec[3], rec[2], (rec[4],)))
            missing += [
                (seq, PREFILL, start + t, layer)
                for layer in range(num_layers)
                for t in range(tokens)
                if (layer, t) not in seen
            ]
            position[seq] = start + tokens
        else:
            step = position.get(seq, 0)
            cells += [Cell(seq, DECODE, step, rec[2], (rec[4],)) for rec in call]
            position[seq] = step + 1
    missing += missing_decode_cells(cells, num_layers)
    notes = [
        "vLLM hook dropped records with weights exactly [0.5, 0.5]: "
        f"{sum(1 for m in missing if m[1] == PREFILL)} prefill and "
        f"{sum(1 for m in missing if m[1] == DECODE)} decode (token, layer) cells missing, skipped"
    ]
    return Trace(path.name, _model(path), num_layers, num_experts, TOP_K, cells, missing, notes)


def read_vllm_per_layer(path) -> Trace:
    """``token_idx`` layout: decode only; the step is the upstream per-layer counter."""
    path = Path(path)
    records = _records(path, "token_idx")
    num_layers, num_experts = _shape(path, records)
    seq_of: dict[tuple, int] = {}
    by_seq_layer: dict[tuple[int, int], dict[int, tuple[int, ...]]] = {}
    for dataset, problem, layer, idx, experts in records:
        seq = seq_of.setdefault((dataset, problem), len(seq_of))
        column = by_seq_layer.setdefault((seq, layer), {})
        if idx in column:
            raise TraceError(f"{path}: duplicate record for problem {problem} layer {layer} token_idx {idx}")
        column[idx] = experts
    cells: list[Cell] = []
    missing: list[tuple[int, str, int, int]] = []
    notes: list[str] = []
    for seq in range(len(seq_of)):
        columns = {l: by_seq_layer.get((seq, l), {}) for l in range(num_layers)}
        steps = max(max(c, default=-1) for c in columns.values()) + 1
        for step in range(steps):
            for layer in range(num_layers):
                experts = columns[layer].get(step)
                if experts is None:
                    missing.append((seq, DECODE, step, layer))
                else:
                    cells.append(Cell(seq, DECODE, step, layer, (experts,)))
        short = {l: steps - len(c) for l, c in columns.items() if len(c) < steps}
        if short:
            worst = max(short.values())
            notes.append(
                f"sequence {seq} ({'/'.join(map(str, list(seq_of)[seq]))}): {sum(short.values())} dropped "
                f"decode records in {len(short)} layers; the upstream per-layer counter puts the gap at "
                f"the end, so cross-layer alignment there may be off by up to {worst} step(s)"
            )
    return Trace(path.name, _model(path), num_layers, num_experts, TOP_K, cells, missing, notes)
