"""FreeToken's own routing-trace format ("freetoken-routing-trace", version 1).

JSONL. Line 1 is the header::

    {"format": "freetoken-routing-trace", "version": 1, "num_layers": L,
     "num_experts": E, "top_k": K, "model": "..."}

then one record per (step, layer) in execution order::

    {"phase": "prefill"|"decode", "step": s, "layer": l,
     "experts": [[ids of token 0], [ids of token 1], ...], "weights": [[...], ...]}

``weights`` is optional. Optional header fields: ``expert_bytes`` (int or per-layer
list), ``dense_bytes`` (same), ``seq`` in a record (sequence id, default 0).
``TraceWriter`` sits in the engine's decode hot path: it only formats and buffers.
"""

from __future__ import annotations

import json
from typing import Any

FORMAT_NAME = "freetoken-routing-trace"
FORMAT_VERSION = 1
HEADER_FIELDS = ("num_layers", "num_experts", "top_k", "model")


def _rows(x: Any) -> list:
    if hasattr(x, "detach"):  # a torch tensor on any device
        x = x.detach().cpu()
    if hasattr(x, "tolist"):  # torch or numpy
        x = x.tolist()
    if x and not isinstance(x[0], (list, tuple)):
        return [list(x)]  # one token's ids given as a 1-D row
    return [list(r) for r in x]


class TraceWriter:
    """Appends routing records to ``path``; call ``close()`` (or use ``with``) to flush."""

    def __init__(self, path, header: dict, buffer_lines: int = 4096):
        missing = [f for f in HEADER_FIELDS if f not in header]
        if missing:
            raise ValueError(f"trace header is missing field(s) {', '.join(missing)}")
        self._file = open(path, "w", encoding="utf-8")
        self._lines: list[str] = []
        self._buffer_lines = buffer_lines
        head = {"format": FORMAT_NAME, "version": FORMAT_VERSION, **header}
        self._lines.append(json.dumps(head))

    def write(self, phase: str, step: int, layer: int, topk_ids_2d, topk_weights_2d=None, seq: int | None = None):
        record = {"phase": phase, "step": int(step), "layer": int(layer), "experts": _rows(topk_ids_2d)}
        if topk_weights_2d is not None:
            record["weights"] = [[round(float(w), 6) for w in row] for row in _rows(topk_weights_2d)]
        if seq is not None:
            record["seq"] = int(seq)
        self._lines.append(json.dumps(record, separators=(",", ":")))
        if len(self._lines) >= self._buffer_lines:
            self.flush()

    def flush(self) -> None:
        if self._lines:
            self._file.write("\n".join(self._lines) + "\n")
            self._lines.clear()
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self.flush()
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
