"""The engine's own cache policies, replayed: each access goes through the engine's
`SlotTable` (freetoken/experts/slots.py), one key at a time: a hit refreshes the entry, a
miss is filled into the table's first victim, never one of the same cell's experts (the engine
locks a layer call's experts; here they stay locked until the cell is over) (or, with admission control, runs on the CPU
when the table declines it; as in the engine, only decode misses are declined, prefill
fills every miss). With "+prefetch", after each decode cell the table's guesses for the
next layer are copied in (the predictor also learns from the prompt's rows) (landed before that layer runs, as the engine's background copies
are on a synchronous link) and counted in `prefetches`. `default` replays what the engine uses by default."""

from __future__ import annotations

import numpy as np

from freetoken.experts.next_layer import THRESHOLD
from freetoken.experts.slots import DEFAULT_POLICY, HALF_LIFE_TOKENS, SlotTable
from freetoken.sim.policies.base import Policy


class SlotTablePolicy(Policy):
    table_policy = DEFAULT_POLICY
    half_life = HALF_LIFE_TOKENS        # lrfu's, in tokens (bench/policy_sweep.py varies it)
    threshold = THRESHOLD               # "+prefetch": the predictor's (bench/prefetch_sweep.py varies it)

    def __init__(self, slots, num_layers, num_experts):
        super().__init__(slots, num_layers, num_experts)
        self.fills = 0
        self._locked: list[int] = []      # slots of the cell under way (locked, as the engine's call)
        self._cell_layer = -1
        self.table = SlotTable(num_layers * num_experts, num_experts, slots, self.table_policy, self.half_life,
                               self.threshold)

    def prefill_access(self, key: int) -> bool:
        return self.access(key, admission=False)

    def access(self, key: int, admission: bool = True) -> bool:
        """One key of a cell. As in the engine, the cell's experts stay locked until the cell
        is over (a cell's hits and fills are never the victims of its other misses)."""
        t = self.table
        layer = key // self.num_experts
        if layer != self._cell_layer:              # a new cell (prefill cells have no end_cell)
            self._unlock_cell()
            self._cell_layer = layer
        k = np.array([key])
        t.record(k)
        slot = t.slot_of[key]
        if slot >= 0:
            t.touch(np.array([slot]))
            t.lock(np.array([slot]))
            self._locked.append(slot)
            return True
        victim = t.candidates(1, k)
        if len(victim) and (not admission or t.admit(k, victim)[0]):
            t.assign(k, victim)
            t.ready(victim)
            self._locked.append(int(victim[0]))
            self.fills += 1
        return False

    def _unlock_cell(self) -> None:
        if self._locked:
            self.table.unlock(np.array(self._locked, np.int64))
            self._locked = []

    def place(self, prompt_counts) -> None:
        self._unlock_cell()
        self._cell_layer = -1

    def prompt_rows(self, layer: int, rows) -> None:
        learn_prompt(self.table, layer, rows)

    def end_cell(self, cell: tuple[int, ...]) -> None:
        t = self.table
        self._unlock_cell()
        self._cell_layer = -1
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
    """Teach the table's predictor a prefill cell's rows (skipped if ragged: a lost row)."""
    if table.predictor is not None and rows and len({len(r) for r in rows}) == 1:
        table.learn_prompt(layer, np.asarray(rows, np.int64))


def slot_policy(name: str, table_policy: str, half_life: float = HALF_LIFE_TOKENS,
                threshold: float = THRESHOLD) -> type[SlotTablePolicy]:
    return type(f"SlotTable_{name}", (SlotTablePolicy,),
                {"name": name, "table_policy": table_policy, "half_life": half_life, "threshold": threshold})
