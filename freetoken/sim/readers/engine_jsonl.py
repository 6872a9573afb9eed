"""Reader for FreeToken's own recording format (see ``freetoken.experts.measure.trace_format``)."""

from __future__ import annotations

from pathlib import Path

from freetoken.sim.readers.common import id_list, int_field, json_lines, missing_decode_cells
from freetoken.sim.trace import PHASES, Cell, Trace, TraceError
from freetoken.experts.measure.trace_format import FORMAT_NAME, FORMAT_VERSION, HEADER_FIELDS


def _per_layer(value, num_layers: int, field: str, where: str) -> list[int] | None:
    if value is None:
        return None
    if isinstance(value, int):
        return [value] * num_layers
    if isinstance(value, list) and len(value) == num_layers and all(isinstance(v, int) for v in value):
        return list(value)
    raise TraceError(f"{where}: header field {field!r} must be an int or a list of {num_layers} ints")


def read_engine_jsonl(path) -> Trace:
    path = Path(path)
    lines = json_lines(path)
    where, head = next(lines, (f"{path}:1", {}))
    if head.get("format") != FORMAT_NAME:
        raise TraceError(f"{where}: header field 'format' must be {FORMAT_NAME!r}")
    if head.get("version") != FORMAT_VERSION:
        raise TraceError(f"{where}: header field 'version' is {head.get('version')!r}; this reader knows {FORMAT_VERSION}")
    for field in HEADER_FIELDS:
        if field not in head:
            raise TraceError(f"{where}: header has no field {field!r}")
    num_layers = int_field(head, "num_layers", where)
    num_experts = int_field(head, "num_experts", where)
    top_k = int_field(head, "top_k", where)
    cells: list[Cell] = []
    for where, r in lines:
        phase = r.get("phase")
        if phase not in PHASES:
            raise TraceError(f"{where}: field 'phase' must be 'prefill' or 'decode', got {phase!r}")
        experts = r.get("experts")
        if not isinstance(experts, list):
            raise TraceError(f"{where}: field 'experts' must be a list of per-token id lists")
        rows = tuple(id_list(row, "experts", where) for row in experts)
        seq = int_field(r, "seq", where) if "seq" in r else 0
        cell = Cell(seq, phase, int_field(r, "step", where), int_field(r, "layer", where), rows)
        if not 0 <= cell.layer < num_layers:
            raise TraceError(f"{where}: field 'layer' is {cell.layer}, outside 0..{num_layers - 1}")
        cells.append(cell)
    trace = Trace(
        path.name,
        str(head["model"]),
        num_layers,
        num_experts,
        top_k,
        cells,
        missing_decode_cells(cells, num_layers),
        [],
        _per_layer(head.get("expert_bytes"), num_layers, "expert_bytes", f"{path}:1"),
        _per_layer(head.get("dense_bytes"), num_layers, "dense_bytes", f"{path}:1"),
    )
    trace.validate()
    return trace
