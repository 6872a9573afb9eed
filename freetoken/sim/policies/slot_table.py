"""The engine's own cache policies, replayed: each access goes through the engine's
`SlotTable` (freetoken/experts/memory/slots.py), one key at a time: a hit refreshes the entry, a
miss is filled into the table's first victim (whole cells at once through `access_cell`, as the
engine's layer call: never one of the same cell's experts is a victim) (or, with admission control, runs on the CPU
when the table declines it; as in the engine, only decode misses are declined, prefill
fills every miss). With "+prefetch", after each decode cell the table's guesses for the
next layer are copied in (the predictor also learns from the prompt's rows) (landed before that layer runs, as the engine's background copies
are on a synchronous link) and counted in `prefetches`. `default` replays what the engine uses by default."""

from __future__ import annotations

import numpy as np

from freetoken.experts.memory.slots import DEFAULT_POLICY, HALF_LIFE_TOKENS, SlotTable
from freetoken.sim.policies.base import Policy


class SlotTablePolicy(Policy):
    table_policy = DEFAULT_POLICY
    half_life = HALF_LIFE_TOKENS        # lrfu's, in tokens (bench/policy_sweep.py varies it)
    threshold = None                    # "+prefetch": the predictor's, None: the table's own for the policy
    #                                     (bench/prefetch_sweep.py varies it)

    def __init__(self, slots, num_layers, num_experts):
        super().__init__(slots, num_layers, num_experts)
        self.fills = 0
        self.table = SlotTable(num_layers * num_experts, num_experts, slots, self.table_policy, self.half_life,
                               self.threshold)

    def prefill_access(self, key: int) -> bool:
        return self.access(key, admission=False)

    def access(self, key: int, admission: bool = True) -> bool:
        return bool(self._serve((key,), admission)[0])

    def access_cell(self, cell, admission: bool = True):
        """A whole cell (one layer call). '+layer' tables serve it as the engine does
        (`SlotTable.serve`: its experts looked up and locked together, so none is the victim
        of another's miss; the layer-aware order needs that, or the cell's later keys would
        look like the layer just run). The others replay key by key, as their references in
        tests/sim/sim_reference.py model them (the same as the engine's unless a cell's own
        fill would evict another of its keys, which LRU never does)."""
        if self.table.layer_aware:
            return self._serve(cell, admission)
        return [self.access(k, admission) for k in cell]

    def prefill_cell(self, cell):
        return self.access_cell(cell, admission=False)

    def _serve(self, cell, admission: bool) -> np.ndarray:
        keys = np.asarray(cell, np.int64)
        hit = self.table.serve(keys, admission)
        self.fills += int((self.table.slot_of[keys[~hit]] >= 0).sum())
        return hit

    def prompt_rows(self, layer: int, rows) -> None:
        learn_prompt(self.table, layer, rows)

    def end_cell(self, cell: tuple[int, ...]) -> None:
        t = self.table
        if t.predictor is None:
            return
        keys, slots = t.prefetch_after(np.asarray(cell, np.int64))
        if len(keys):
            t.assign(keys, slots)
            t.ready(slots)
            t.unlock(slots)

    @property
    def prefetches(self) -> int:
        return self.table.prefetches

    @property
    def transfers(self) -> int:
        """Every copy into the cache: admitted misses (prefill included) and prefetches."""
        return self.fills + self.table.prefetches


def learn_prompt(table: SlotTable, layer: int, rows) -> None:
    """Give the table a prefill cell's rows (its predictor learns, '+prompt' weighs the counts;
    skipped if ragged: a lost row)."""
    if (table.predictor is not None or table.prompt_weighted) and rows and len({len(r) for r in rows}) == 1:
        table.learn_prompt(layer, np.asarray(rows, np.int64))


def slot_policy(name: str, table_policy: str, half_life: float = HALF_LIFE_TOKENS,
                threshold: float | None = None) -> type[SlotTablePolicy]:
    return type(f"SlotTable_{name}", (SlotTablePolicy,),
                {"name": name, "table_policy": table_policy, "half_life": half_life, "threshold": threshold})
