"""The one in-memory form every trace reader produces.

A trace is a list of cells in execution order. A cell is what one MoE layer routed
for one step: for prefill, one row of expert ids per prompt token; for decode, one
row per token decoded in that step (one row at batch size 1). Cells the source lost
are not invented: the reader leaves them out and lists them in ``missing``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from freetoken.errors import FreeTokenError

PREFILL = "prefill"
DECODE = "decode"
PHASES = (PREFILL, DECODE)


class TraceError(FreeTokenError, ValueError):
    """A routing-trace file is missing, malformed, or inconsistent (message names file and field)."""


@dataclass(frozen=True)
class Cell:
    seq: int
    phase: str
    step: int
    layer: int
    rows: tuple[tuple[int, ...], ...]

    def experts(self) -> tuple[int, ...]:
        """The union of the rows' experts, ascending: the access order of the replay."""
        return tuple(sorted({e for row in self.rows for e in row}))


@dataclass
class Trace:
    name: str
    model: str
    num_layers: int
    num_experts: int
    top_k: int
    cells: list[Cell]
    missing: list[tuple[int, str, int, int]] = field(default_factory=list)  # (seq, phase, step, layer)
    notes: list[str] = field(default_factory=list)
    expert_bytes: list[int] | None = None  # per layer, when the source records it
    dense_bytes: list[int] | None = None  # per layer non-expert bytes, when recorded

    def decode_tokens(self) -> int:
        """Tokens decoded: one per row of each decode step (a batched step decodes several)."""
        rows: dict[tuple[int, int], int] = {}
        for c in self.cells:
            if c.phase == DECODE:
                rows[(c.seq, c.step)] = max(rows.get((c.seq, c.step), 0), len(c.rows))
        return sum(rows.values())

    def summary(self) -> str:
        prefill = sum(1 for c in self.cells if c.phase == PREFILL)
        decode = len(self.cells) - prefill
        seqs = len({c.seq for c in self.cells})
        return (
            f"{self.name}: {self.model}, {self.num_layers} layers x {self.num_experts} experts, "
            f"top-{self.top_k}, {seqs} sequence(s), {prefill} prefill cells, {decode} decode cells "
            f"({self.decode_tokens()} decode tokens), {len(self.missing)} missing cells skipped"
        )

    def validate(self) -> None:
        for c in self.cells:
            if c.phase not in PHASES:
                raise TraceError(f"{self.name}: cell phase {c.phase!r} is not prefill/decode")
            if not 0 <= c.layer < self.num_layers:
                raise TraceError(f"{self.name}: layer {c.layer} outside 0..{self.num_layers - 1}")
            for row in c.rows:
                for e in row:
                    if not 0 <= e < self.num_experts:
                        raise TraceError(
                            f"{self.name}: expert id {e} at layer {c.layer} step {c.step} "
                            f"outside 0..{self.num_experts - 1}"
                        )


def with_prompt_tokens(trace: Trace, n: int) -> Trace:
    """Relabel the first ``n`` decode steps of every sequence without a prefill as its prompt.

    For decode-only and teacher-forced traces, so that prompt-driven policies have a prompt.
    """
    if n <= 0:
        return trace
    has_prefill = {c.seq for c in trace.cells if c.phase == PREFILL}
    first_steps: dict[int, set[int]] = {}
    for c in trace.cells:
        if c.seq in has_prefill or c.phase != DECODE:
            continue
        steps = first_steps.setdefault(c.seq, set())
        if len(steps) < n:
            steps.add(c.step)

    def relabel(seq: int, phase: str, step: int) -> str:
        return PREFILL if phase == DECODE and step in first_steps.get(seq, ()) else phase

    cells = [Cell(c.seq, relabel(c.seq, c.phase, c.step), c.step, c.layer, c.rows) for c in trace.cells]
    missing = [(s, relabel(s, p, st), st, l) for s, p, st, l in trace.missing]
    notes = trace.notes + [f"first {n} decode steps of each prompt-less sequence relabelled as prefill"]
    return Trace(
        trace.name, trace.model, trace.num_layers, trace.num_experts, trace.top_k, cells,
        missing, notes, trace.expert_bytes, trace.dense_bytes,
    )
