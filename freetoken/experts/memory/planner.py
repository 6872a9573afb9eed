"""The miss planner: per MoE layer, per step, who runs where.

1. Deduplicate the routed experts of the step (all tokens); look them up in the cache:
   hits H (resident and landed), in-flight (a background fill has not landed yet), and
   the m unique misses M.
2. Split M into a fill set F (copied into the cache, run on the device with H) and a
   CPU set C (run in place from the host pool; residency untouched):

       q* = round(m * B_P / B_H), clamped to [1, m]

   (`balanced_q` rounds to whichever neighbour of m*B_P/B_H gives the shorter slower
   branch, the same as round() except near .5.)

   B_P is the link rate of fills and B_H the host rate (fills plus the CPU branch
   share the host memory system, so the CPU branch gets B_H - B_P while the link is
   busy). Equal branch times q/B_P = (m - q)/(B_H - B_P) give exactly this q*.
   `offload` fills every miss (q = m); `cpu` never fills; `pageable` (the host banks could
   not be page-locked, experts/memory/pinning.py) runs every miss on the CPU and keeps the cache
   warming with one background fill per layer call (rule 4's background fill, always).
3. Which misses fill (the documented rule): the misses routed by the most tokens this
   step first (they save the most device work); ties go to the expert requested in the
   most recent steps (a decayed per-expert demand count: the likeliest to be reused),
   then to the lower id. The rest form C.
4. At least one fill while m > 0 keeps the cache warming. When the balance says 0 (one
   fill would take longer than all m misses on the CPU) the link is too slow for a fill
   to pay off inside this step, so that single fill is a *background* fill: the expert
   runs on the CPU now and its copy lands in the cache for later steps without the step
   waiting for it (skipped while an earlier background fill is still on the link, so a
   slow link never backs up).
5. Exploration: when q = m for a while, every `explore_every`-th layer-step with m >= 2
   sends one miss to the CPU so the online CPU-rate estimate stays current.
6. `SplitGuard` checks the model against realised time (plain filling vs q*).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

_EMPTY = np.empty(0, np.int64)


def q_star(m: int, b_p: float, b_h: float) -> int:
    """round(m * B_P / B_H) clamped to [1, m] (0 when there are no misses)."""
    if m <= 0:
        return 0
    if b_h <= 0 or b_p >= b_h:
        return m
    return min(m, max(1, math.floor(m * b_p / b_h + 0.5)))


def balanced_q(m: int, b_p: float, b_h: float) -> int:
    """m * B_P / B_H rounded to whichever neighbour gives the shorter slower branch
    (q / B_P against (m - q) / (B_H - B_P)); in [0, m], no clamp. The same as round()
    except near .5, where it picks the neighbour the model prefers."""
    if m <= 0:
        return 0
    if b_h <= 0 or b_p >= b_h:
        return m
    x, cpu_rate = m * b_p / b_h, b_h - b_p
    return min((math.floor(x), math.ceil(x)), key=lambda q: (max(q / b_p, (m - q) / cpu_rate), q))


@dataclass
class LayerPlan:
    fill: np.ndarray        # flat ids copied into the cache and run on the device now
    warm: np.ndarray        # flat ids run on the CPU now and filled in the background
    cpu: np.ndarray         # flat ids run on the CPU, residency untouched
    q: int                  # q* before the background rule (what the formula chose)

    @property
    def m(self) -> int:
        return len(self.fill) + len(self.warm) + len(self.cpu)


class MissPlanner:
    POLICIES = ("offload", "hybrid", "cpu", "pageable")

    def __init__(self, num_flat: int, policy: str, explore_every: int = 16,
                 demand_halflife_steps: int = 64):
        if policy not in self.POLICIES:
            raise ValueError(f"planner policy: expected one of {self.POLICIES}, got {policy!r}")
        self.policy = policy
        self.demand = np.zeros(num_flat, np.float32)
        self.explore_every = explore_every
        self.halve_every = demand_halflife_steps
        self.fixed_q: int | None = None        # benchmarks: a fixed q instead of q*
        self.calls = 0
        self.steps = 0

    def end_step(self) -> None:
        self.steps += 1
        if self.steps % self.halve_every == 0:
            self.demand *= 0.5

    def order(self, misses: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """The fill priority of `misses` (flat ids) routed by `tokens` tokens each."""
        if len(misses) <= 1:
            return misses
        idx = np.lexsort((misses, -self.demand[misses], -tokens))
        return misses[idx]

    def plan(self, misses: np.ndarray, tokens: np.ndarray, b_p: float, b_h: float,
             link_busy: bool = False, policy: str | None = None) -> LayerPlan:
        policy = policy or self.policy
        self.calls += 1
        m = len(misses)
        if m == 0:
            return LayerPlan(_EMPTY, _EMPTY, _EMPTY, 0)
        ranked = self.order(misses, tokens)
        if policy == "cpu":
            return LayerPlan(_EMPTY, _EMPTY, ranked, 0)
        if policy == "offload":
            return LayerPlan(ranked, _EMPTY, _EMPTY, m)
        if policy == "pageable":     # a copy from pageable memory never holds up the step
            if link_busy:
                return LayerPlan(_EMPTY, _EMPTY, ranked, 0)
            return LayerPlan(_EMPTY, ranked[:1], ranked[1:], 0)
        if self.fixed_q is not None:
            q = min(m, self.fixed_q)
            return LayerPlan(ranked[:q], _EMPTY, ranked[q:], q)
        raw = balanced_q(m, b_p, b_h)
        q = max(1, raw)
        if raw == 0:                 # the clamp, not the balance, chose 1: don't wait for it
            if link_busy:
                return LayerPlan(_EMPTY, _EMPTY, ranked, q)
            return LayerPlan(_EMPTY, ranked[:1], ranked[1:], q)
        if q == m and m >= 2 and self.explore_every and self.calls % self.explore_every == 0:
            return LayerPlan(ranked[:m - 1], _EMPTY, ranked[m - 1:], q)
        return LayerPlan(ranked[:q], _EMPTY, ranked[q:], q)

    def record(self, flat_ids: np.ndarray) -> None:
        self.demand[flat_ids] += 1.0


class SplitGuard:
    """Keeps the q* split honest against plain filling, on realised time.

    The q* model prices bytes; real branches also pay fixed costs (thread hand-offs, kernel
    launches) and the cache warms faster when everything fills. The last 2*`probe` steps of
    every `period` decode steps time plain filling (q = m), then q*; the next period runs
    with plain filling only if its median MoE step time beat q*'s by `margin` (q* is the
    default: the model decides unless measurements clearly disagree). Probing costs at most
    probe/period of the slower option's extra time."""

    def __init__(self, probe: int = 3, period: int = 32, margin: float = 0.1):
        self.probe, self.period, self.margin = probe, period, margin
        self.step = -1
        self.times = {"fill": [], "qstar": []}
        self.winner = "qstar"
        self.switches = 0
        self.fill_steps = 0

    def mode(self) -> str:
        i = self.step % self.period
        if i < self.period - 2 * self.probe:
            return self.winner
        return "fill" if i < self.period - self.probe else "qstar"

    def next_step(self) -> str:
        self.step += 1
        mode = self.mode()
        self.fill_steps += mode == "fill"
        return mode

    def record(self, seconds: float) -> None:
        """The MoE time of the step started by the last next_step()."""
        i = self.step % self.period
        if i >= self.period - 2 * self.probe:
            self.times[self.mode()].append(seconds)
        if i == self.period - 1:
            if self.times["fill"] and self.times["qstar"]:
                fill, qstar = (float(np.median(self.times[k])) for k in ("fill", "qstar"))
                winner = "fill" if fill < (1 - self.margin) * qstar else "qstar"
                self.switches += winner != self.winner
                self.winner = winner
            self.times = {"fill": [], "qstar": []}
