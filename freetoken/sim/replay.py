"""Drive a policy over an access stream and count decode misses."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from freetoken.sim.access import AccessStream
from freetoken.sim.policies import POLICIES, Policy
from freetoken.sim.trace import PREFILL


@dataclass(frozen=True)
class ReplayResult:
    policy: str
    slots: int
    accesses: int  # decode accesses
    misses: int
    prefetches: int = 0  # transfers made ahead of use (a prefetching policy's copies)
    transfers: int | None = None  # every copy into the cache (the engine's policies)

    @property
    def miss_rate(self) -> float:
        return self.misses / self.accesses if self.accesses else 0.0


def prefill_cells(policy: Policy, seg):
    """Feed a prefill segment to the policy (with its prompt rows where the trace has them),
    yielding each cell's hits; once consumed, the prompt's counts are placed."""
    for i, cell in enumerate(seg.cells):
        if seg.rows:
            policy.prompt_rows(seg.layers[i], seg.rows[i])
        yield policy.prefill_cell(cell)
    policy.place(seg.prompt_counts)


def replay_hits(policy: Policy, stream: AccessStream) -> list[tuple[str, bool]]:
    """(phase, hit) for every access, prefill included, in stream order."""
    out: list[tuple[str, bool]] = []
    policy.prepare(stream)
    policy.place(Counter())
    for seg in stream.segments:
        if seg.phase == PREFILL:
            for hits in prefill_cells(policy, seg):
                out += [(PREFILL, bool(h)) for h in hits]
        else:
            for cell in seg.cells:
                out += [(seg.phase, bool(h)) for h in policy.access_cell(cell)]
                policy.end_cell(cell)
    return out


def replay(name: str, stream: AccessStream, slots: int) -> ReplayResult:
    policy = POLICIES[name](slots, stream.num_layers, stream.num_experts)
    policy.prepare(stream)
    policy.place(Counter())
    accesses = misses = 0
    for seg in stream.segments:
        if seg.phase == PREFILL:
            for _ in prefill_cells(policy, seg):
                pass
            continue
        access_cell, end_cell = policy.access_cell, policy.end_cell
        for cell in seg.cells:
            accesses += len(cell)
            misses += len(cell) - int(sum(access_cell(cell)))
            end_cell(cell)
    return ReplayResult(name, slots, accesses, misses, policy.prefetches, policy.transfers)
