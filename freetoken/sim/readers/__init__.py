"""Trace readers: every format in the shared routing-trace data, and the engine's own."""

from __future__ import annotations

import json
from pathlib import Path

from freetoken.sim.trace import Trace, TraceError
from freetoken.experts.measure.trace_format import FORMAT_NAME
from freetoken.sim.readers.engine_jsonl import read_engine_jsonl
from freetoken.sim.readers.flame import read_flame
from freetoken.sim.readers.route_csv import read_route_csv
from freetoken.sim.readers.vllm_hook_jsonl import read_vllm_per_layer, read_vllm_raw


def load_trace(path) -> Trace:
    """Read any supported trace file (or FLAME layer folder) into a ``Trace``; format is sniffed."""
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such file or directory")
    if p.is_dir():

        return read_flame(p)
    if p.suffix == ".pt":

        return read_flame(p)
    first = _first_line(p)
    if first.startswith("# route_trace"):

        return read_route_csv(p)
    if first.startswith("layer_id,token_id,expert_0"):

        return read_flame(p)
    if first.startswith("{"):
        try:
            head = json.loads(first)
        except json.JSONDecodeError as e:
            raise TraceError(f"{p}:1: not valid JSON ({e.msg})") from None
        if head.get("format") == FORMAT_NAME:

            return read_engine_jsonl(p)
        if "token_pos" in head:

            return read_vllm_raw(p)
        if "token_idx" in head:

            return read_vllm_per_layer(p)
    raise TraceError(
        f"{p}: unrecognised trace format (expected route_trace CSV, FLAME .pt/.csv, "
        f"vLLM-hook JSONL with token_pos/token_idx, or {FORMAT_NAME} JSONL)"
    )


def _first_line(p: Path) -> str:
    with open(p, encoding="utf-8", errors="replace") as f:
        return f.readline().strip()
