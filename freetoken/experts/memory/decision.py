"""One MoE layer's cache decision, written once: the engine (`TieredExperts`) executes it
with real tensors and copies, `freetoken sim` (`sim/projection.py`) only counts it.

Given a layer call's unique routed experts (flat ids) and how many tokens routed each:
  1. look them up in the `SlotTable`: hits (resident and landed), in flight (a background
     fill not landed yet: they run on the CPU) and misses;
  2. the caller's `plan_misses` splits the misses (fill / background warm fill / CPU);
  3. count the accesses (planner demand, the table's policy), touch and lock the hits
     (a step's hits are never its victims);
  4. take the victims for the fills in one pass; with admission control a miss whose
     policy score does not beat its victim's runs on the CPU instead;
  5. no evictable slot at all: every fill runs on the CPU (overflow);
  6. the fills go in waves of the evictable slots (`waves`): a wave's slots become
     evictable again once the caller has run it and unlocked them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from .planner import LayerPlan, MissPlanner
from .slots import SlotTable

# (misses, tokens routed to each, evictable slots beside the hits) -> the layer's plan
PlanMisses = Callable[[np.ndarray, np.ndarray, int], LayerPlan]


@dataclass
class LayerDecision:
    table: SlotTable
    uniq: np.ndarray          # the call's unique flat ids (sorted)
    hit: np.ndarray           # bool per uniq: resident and landed, run from the cache
    hit_slots: np.ndarray     # their slots (locked until `release`)
    plan: LayerPlan           # after admission: declined misses moved to plan.cpu
    warm: np.ndarray          # background fill (at most one), runs on the CPU now
    warm_slots: np.ndarray    # its victim slot
    fill: np.ndarray          # misses filled this call, in fill order
    first_slots: np.ndarray   # victims of the first wave
    cpu_ids: np.ndarray       # everything the CPU branch runs (CPU set, warm, in flight, overflow)

    @property
    def hits(self) -> int:
        return int(self.hit.sum())

    @property
    def misses(self) -> int:
        """Unique experts not run from the cache (in-flight ones included)."""
        return len(self.uniq) - self.hits

    def waves(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(flat ids, victim slots) of each fill wave. Before asking for the next wave the
        caller assigns the wave into its slots (`SlotTable.assign`, via the cache's install),
        runs it, and unlocks the slots."""
        fill, cands = self.fill, self.first_slots
        while len(fill):
            wave, slots, fill = fill[:len(cands)], cands[:len(fill)], fill[len(cands):]
            yield wave, slots
            if len(fill):
                cands = self.table.candidates(len(fill), fill)

    def release(self) -> None:
        """The call is over: its hits may be victims again."""
        self.table.unlock(self.hit_slots)


def decide(table: SlotTable, planner: MissPlanner, uniq: np.ndarray, tokens: np.ndarray,
           plan_misses: PlanMisses, admit: bool) -> LayerDecision:
    """The decision for one layer call (see the module doc). `admit`: the table's admission
    control may decline fills (the engine's hybrid decode split; `offload` and prefill fill
    every miss)."""
    slots = table.slot_of[uniq]
    resident = slots >= 0
    inflight = np.zeros(len(uniq), bool)
    inflight[resident] = table.pending[slots[resident]]
    hit = resident & ~inflight
    miss = ~resident
    plan = plan_misses(uniq[miss], tokens[miss], table.evictable() - int(hit.sum()))
    planner.record(uniq)
    table.record(uniq)
    hit_slots = slots[hit]
    table.touch(hit_slots)
    table.lock(hit_slots)
    fill = plan.fill
    cands = table.candidates(len(fill) if len(fill) else len(plan.warm), fill)
    if admit and table.admission:
        ok = table.admit(fill, cands)
        ok[len(cands):] = True                    # beyond the first wave: no victim to compare with
        plan.cpu, plan.fill = np.concatenate([plan.cpu, fill[~ok]]), fill[ok]
        fill = plan.fill
        cands = cands[np.flatnonzero(ok[:len(cands)])] if len(fill) else table.candidates(len(plan.warm))
    warm = plan.warm if len(cands) else plan.warm[:0]
    overflow = fill if len(cands) == 0 else fill[:0]    # no evictable slot at all: run on the CPU
    if len(overflow):
        fill = fill[:0]
    cpu_ids = np.concatenate([plan.cpu, plan.warm, uniq[inflight], overflow])
    return LayerDecision(table, uniq, hit, hit_slots, plan, warm, cands[:1] if len(warm) else cands[:0],
                         fill, cands if len(fill) else cands[:0], cpu_ids)
