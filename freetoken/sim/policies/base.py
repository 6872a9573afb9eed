"""What every cache policy implements, and the replay loop that drives it."""

from __future__ import annotations

from collections import Counter

from freetoken.sim.access import AccessStream


class Policy:
    """A cache of ``slots`` (layer, expert) entries; keys are ``layer * num_experts + expert``.

    The replay calls ``prepare`` once with the whole stream (only offline policies look),
    ``place`` at the start of the trace and at the end of every prefill (points where
    placements may be rearranged without counting misses), then ``prefill_cell`` / ``access_cell``
    per cell (by default ``prefill_access`` / ``access`` per key),
    and ``end_cell`` after each decode cell.
    """

    name = ""
    prefetches = 0      # transfers made ahead of use (prefetching policies count them)
    transfers: int | None = None    # every copy into the cache (engine policies count them)

    def __init__(self, slots: int, num_layers: int, num_experts: int):
        self.slots = slots
        self.num_layers = num_layers
        self.num_experts = num_experts

    def prepare(self, stream: AccessStream) -> None:
        pass

    def place(self, prompt_counts: Counter) -> None:
        pass

    def access(self, key: int) -> bool:
        """Record one decode access; True on a hit."""
        raise NotImplementedError

    def access_cell(self, cell) -> list[bool]:
        """A decode cell's keys (one layer call); by default one `access` per key, in order
        (the engine's tables serve the cell at once: policies/slot_table.py)."""
        return [self.access(k) for k in cell]

    def prefill_cell(self, cell) -> list[bool]:
        return [self.prefill_access(k) for k in cell]

    def end_cell(self, cell: tuple[int, ...]) -> None:
        """A decode cell (one layer of one token) is done: a prefetching policy acts here."""

    def prompt_rows(self, layer: int, rows) -> None:
        """A prefill cell's per-token expert ids (within the layer), before its accesses."""

    def prefill_access(self, key: int) -> bool:
        """Record one prefill access (not counted); most policies treat it as any access."""
        return self.access(key)
