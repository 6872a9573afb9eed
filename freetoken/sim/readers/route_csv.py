"""``route_trace v1`` CSVs of a llama.cpp-based engine (Helldez/BigMoeOnEdge).

A ``#`` preamble (model, n_layer, n_expert, n_expert_used, per-layer expert_bytes and
dense_bytes), then one row per routed expert:
``turn,phase,step,layer,slot,expert,weight,residency,expert_bytes``. The residency
columns describe that engine's own cache and are ignored.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

from freetoken.sim.readers.common import missing_decode_cells
from freetoken.sim.trace import DECODE, PREFILL, Cell, Trace, TraceError

COLUMNS = ["turn", "phase", "step", "layer", "slot", "expert", "weight", "residency", "expert_bytes"]
_KV = re.compile(r"(\w+)=(\S+)")


def _preamble(path: Path, lines: list[str]) -> dict:
    meta: dict = {"layers": {}}
    for line in lines:
        kv = dict(_KV.findall(line))
        if "layer" in kv:
            meta["layers"][int(kv["layer"])] = (int(kv.get("expert_bytes", 0)), int(kv.get("dense_bytes", 0)))
        else:
            meta.update(kv)
    for field in ("n_layer", "n_expert", "n_expert_used"):
        if field not in meta:
            raise TraceError(f"{path}: preamble has no {field}=")
    return meta


def read_route_csv(path) -> Trace:
    path = Path(path)
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    comments = [l for l in lines if l.startswith("#")]
    body = [l for l in lines if l and not l.startswith("#")]
    meta = _preamble(path, comments)
    num_layers, num_experts, top_k = int(meta["n_layer"]), int(meta["n_expert"]), int(meta["n_expert_used"])
    reader = csv.reader(body)
    header = next(reader, None)
    if header != COLUMNS:
        raise TraceError(f"{path}: CSV header {header} is not {COLUMNS}")
    groups: dict[tuple[int, int, int, int], list[tuple[int, int]]] = {}
    for n, row in enumerate(reader, 2 + len(comments)):
        try:
            turn, phase, step, layer, slot, expert = (int(v) for v in row[:6])
        except ValueError:
            raise TraceError(f"{path}:{n}: columns turn..expert must be integers, got {row[:6]}") from None
        if phase not in (0, 1):
            raise TraceError(f"{path}:{n}: field 'phase' must be 0 (prefill) or 1 (decode), got {phase}")
        groups.setdefault((turn, phase, step, layer), []).append((slot, expert))
    cells: list[Cell] = []
    notes: list[str] = []
    partial = 0
    for (turn, phase, step, layer), slots in sorted(groups.items()):
        if len(slots) != top_k:
            partial += 1
        experts = tuple(e for _, e in sorted(slots))
        cells.append(Cell(turn, PREFILL if phase == 0 else DECODE, step, layer, (experts,)))
    if partial:
        notes.append(f"{partial} cells hold fewer or more than {top_k} rows; replayed with the rows present")
    prompt = sorted({c.step for c in cells if c.phase == PREFILL})
    for layer in range(num_layers):
        have = sum(1 for c in cells if c.phase == PREFILL and c.layer == layer)
        if prompt and have < len(prompt):
            notes.append(
                f"prefill layer {layer}: recorded for {have} of {len(prompt)} prompt tokens "
                "(the engine skips unused outputs); replayed as recorded"
            )
    missing = missing_decode_cells(cells, num_layers)
    notes.append(f"top-{top_k} as the source engine ran it (n_expert_used); may be below the model's native top-k")
    layers = meta["layers"]
    have_bytes = len(layers) == num_layers
    return Trace(
        path.name,
        Path(meta.get("model", "unknown")).name,
        num_layers,
        num_experts,
        top_k,
        cells,
        missing,
        notes,
        [layers[l][0] for l in range(num_layers)] if have_bytes else None,
        [layers[l][1] for l in range(num_layers)] if have_bytes else None,
    )
