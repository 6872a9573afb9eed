"""Helpers shared by the readers."""

from __future__ import annotations

import json

from freetoken.sim.trace import DECODE, Cell, TraceError


def missing_decode_cells(cells: list[Cell], num_layers: int) -> list[tuple[int, str, int, int]]:
    """(seq, decode, step, layer) for every layer absent from a decode step that has other layers."""
    present: dict[tuple[int, int], set[int]] = {}
    for c in cells:
        if c.phase == DECODE:
            present.setdefault((c.seq, c.step), set()).add(c.layer)
    return [
        (seq, DECODE, step, layer)
        for (seq, step), layers in present.items()
        for layer in range(num_layers)
        if layer not in layers
    ]


def json_lines(path):
    """Yield (where, record) for every non-blank line; ``where`` is 'file:line' for messages."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise TraceError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise TraceError(f"{where}: expected a JSON object")
            yield where, record


def int_field(record: dict, name: str, where: str) -> int:
    value = record.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(f"{where}: field {name!r} must be an integer, got {value!r}")
    return value


def id_list(value, name: str, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(e, int) and not isinstance(e, bool) for e in value):
        raise TraceError(f"{where}: field {name!r} must be a list of integer expert ids, got {value!r}")
    return tuple(value)
