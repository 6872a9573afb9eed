"""Project decode tok/s of the engine's miss-split rules by replaying a trace through the
engine's own code: its `SlotTable` (residency, policy, victims) and `MissPlanner` (which
misses fill, in what order).

Per cell (one layer of one token, or of a prefill) exactly what `TieredExperts` does: look
up the cell's unique experts, count the accesses, lock the hits, plan the misses, then fill
them in waves of the evictable slots (a wave's slots become evictable again once it ran)
and run the rest on the CPU. Copies land at once (the timing model prices them). Split
rules for the decode cells:

- ``all-fill``: every miss fills (the engine's ``offload``);  ``all-cpu``: none (``cpu``);
- ``q*``: the planner's own rule (``hybrid``): q = m * B_P / B_H rounded to the shorter
  slower branch, at least one fill (as a background fill when the balance says 0), with the
  engine's B_P and B_H (`planner_rates`: the concurrent link rate, and B_H = that + the CPU
  branch's concurrent rate);
- ``fixed``: q = round(fraction * m);
- ``balanced``: q = round(m * B_P / B_H) with the same rates, without q*'s clamp;
- ``greedy-q``: per cell, the q in 0..m with the least layer time now (ties: more fills).
The last three take the planner's fill order. Prefill cells fill every miss (the engine's
on-demand prefill) and are not timed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources

import numpy as np

from freetoken.experts.measure.bandwidth import q_rates
from freetoken.experts.memory.decision import decide
from freetoken.experts.memory.planner import LayerPlan, MissPlanner, balanced_q
from freetoken.experts.memory.slots import DEFAULT_POLICY, SlotTable, without_prefetch
from freetoken.sim.access import AccessStream
from freetoken.sim.hardware import Hardware
from freetoken.sim.policies.slot_table import learn_prompt
from freetoken.sim.split_time import layer_time
from freetoken.sim.trace import DECODE, Trace

SPLITS = ("all-fill", "all-cpu", "fixed", "q*", "balanced", "greedy-q")


def round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


def planner_rates(hw: Hardware) -> tuple[float, float]:
    """(B_P, B_H) the planner is given: the engine's one definition (experts/measure/bandwidth.py)."""
    return q_rates(hw.link_concurrent_gbps, hw.cpu_concurrent_gbps)


def q_star(m: int, hw: Hardware) -> int:
    if m == 0:
        return 0
    return max(1, balanced_q(m, *planner_rates(hw)))     # the planner's rounding and clamp


def q_balanced(m: int, hw: Hardware) -> int:
    b_p, b_h = planner_rates(hw)
    return round_half_up(m * b_p / b_h)


@dataclass(frozen=True)
class Projection:
    split: str
    slots: int
    tokens: int
    seconds: float  # total decode time of the expert layers
    hits: int
    fills: int
    cpu: int
    prefill_hits: int = 0     # prefill cells (untimed), for comparing with the engine's counters
    prefill_misses: int = 0
    prefetches: int = 0       # "+prefetch" copies (counted, not timed)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else math.inf


def known_model_bytes(model: str) -> dict | None:
    table = json.loads(resources.files(__package__).joinpath("models.json").read_text())
    return table.get(model)


def project(
    stream: AccessStream,
    tokens: int,
    hw: Hardware,
    slots: int,
    split: str,
    expert_bytes: list[float],
    dense_bytes: list[float],
    fraction: float = 0.5,
    cache_policy: str = DEFAULT_POLICY,
) -> Projection:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    if split == "all-cpu":          # the every-expert-on-the-CPU baseline copies nothing ahead either
        cache_policy = without_prefetch(cache_policy)
    table = SlotTable(stream.universe, stream.num_experts, slots, cache_policy)
    planner = MissPlanner(stream.universe, "cpu" if split == "all-cpu" else "offload" if split == "all-fill" else "hybrid")
    seconds = 0.0
    hits_total = fills_total = cpu_total = pre_hits = pre_misses = 0
    last_layer = -1
    for seg in stream.segments:
        decode = seg.phase == DECODE
        for i, (cell, layer) in enumerate(zip(seg.cells, seg.layers)):
            if layer <= last_layer or not decode:      # a new engine step
                planner.end_step()
            last_layer = layer if decode else -1
            uniq = np.asarray(cell, np.int64)
            if not decode and seg.rows:
                learn_prompt(table, layer, seg.rows[i])
            routed = np.asarray(seg.token_counts[i], np.int64) if seg.token_counts else np.ones(len(uniq), np.int64)
            b, d = expert_bytes[layer], dense_bytes[layer]
            hits, fills, cpu = run_cell(table, planner, uniq, routed, decode, lambda misses, counts, room: _plan(
                planner, split, misses, counts, hw, fraction, room,
                lambda q: layer_time(len(uniq) - len(misses), q, len(misses) - q, b, d, hw)),
                admit=split != "all-fill")
            if decode:
                seconds += layer_time(hits, fills, cpu, b, d, hw)
                hits_total, fills_total, cpu_total = hits_total + hits, fills_total + fills, cpu_total + cpu
            else:
                pre_hits, pre_misses = pre_hits + hits, pre_misses + fills + cpu
    return Projection(split, slots, tokens, seconds, hits_total, fills_total, cpu_total, pre_hits, pre_misses,
                      table.prefetches)


def run_cell(table: SlotTable, planner: MissPlanner, uniq: np.ndarray, tokens: np.ndarray, decode: bool,
             plan_misses, admit: bool = True) -> tuple[int, int, int]:
    """One layer call of `TieredExperts`: the engine's own `decide`, executed on the table
    alone (copies land at once): `uniq` the cell's experts, `tokens` how many tokens routed
    each. `plan_misses(misses, their tokens, room)` returns the decode `LayerPlan`. Returns
    (hits, experts filled, experts run on the CPU). `admit`: the table's admission control
    applies (the engine's hybrid split; `offload` fills every miss)."""
    if not decode:      # the engine's on-demand prefill: every miss fills
        plan_misses = lambda misses, counts, _room: planner.plan(misses, counts, 1.0, 1.0, policy="offload")  # noqa: E731
    d = decide(table, planner, uniq, tokens, plan_misses, admit=decode and admit)
    if len(d.warm):                                 # a background fill: runs on the CPU now
        _land(table, d.warm, d.warm_slots)
    filled = 0
    for wave, slots in d.waves():
        _land(table, wave, slots)
        filled += len(wave)
    d.release()
    if decode:                                      # "+prefetch": the engine's background copies
        ids, slots = table.prefetch_after(uniq)
        if len(ids):
            _land(table, ids, slots)
    return d.hits, filled, d.misses - filled


def _land(table: SlotTable, flat_ids: np.ndarray, slots: np.ndarray) -> None:
    table.assign(flat_ids, slots)
    table.ready(slots)
    table.unlock(slots)


def _plan(planner: MissPlanner, split: str, misses: np.ndarray, tokens: np.ndarray, hw: Hardware, fraction: float,
          room: int, time_of) -> LayerPlan:
    m = len(misses)
    if split in ("all-fill", "all-cpu"):
        return planner.plan(misses, tokens, *planner_rates(hw))
    if split == "q*":
        return planner.plan(misses, tokens, *planner_rates(hw), policy="hybrid")
    ranked = planner.order(misses, tokens)
    if split == "fixed":
        q = round_half_up(fraction * m)
    elif split == "balanced":
        q = q_balanced(m, hw)
    else:   # greedy-q
        q = min(range(min(m, max(room, 0)), -1, -1), key=time_of)
    return LayerPlan(ranked[:q], ranked[:0], ranked[q:], q)


def model_bytes(trace: Trace, expert_bytes: float | None) -> tuple[list[float], list[float]]:
    """Per-layer (expert bytes, dense bytes): flag, then the trace's own record, then models.json."""
    L = trace.num_layers
    known = known_model_bytes(trace.model) or {}
    dense = trace.dense_bytes or [known.get("dense_bytes", 0)] * L
    if expert_bytes is not None:
        return [float(expert_bytes)] * L, [float(x) for x in dense]
    if trace.expert_bytes:
        return [float(x) for x in trace.expert_bytes], [float(x) for x in dense]
    if "expert_bytes" in known:
        return [float(known["expert_bytes"])] * L, [float(x) for x in dense]
    raise ValueError(f"{trace.name}: the trace records no expert size for model {trace.model!r}; pass --expert-bytes")


def best_fixed_fraction(stream, tokens, hw, slots, expert_bytes, dense_bytes, steps: int = 10,
                        cache_policy: str = DEFAULT_POLICY) -> tuple[float, Projection]:
    """Sweep the fixed hybrid's fill fraction over 0, 1/steps, ..., 1; return the fastest."""
    runs = [
        (i / steps, project(stream, tokens, hw, slots, "fixed", expert_bytes, dense_bytes, i / steps, cache_policy))
        for i in range(steps + 1)
    ]
    return max(runs, key=lambda fr: fr[1].tokens_per_second)
