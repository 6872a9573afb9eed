"""The price of a verify: seconds of one engine step as

    T = a + b * positions + c * experts

`positions` the rows in the forward, `experts` the distinct (layer, expert) pairs they route
to (0 for a dense model). a is the step's fixed part (weights of the dense part read once,
the engine's per-step overhead), b each extra position's dense and attention work, c what one
more expert costs where it runs now (a device hit, a CPU run at B_H, a fill at B_P, a disk
read at B_D: the measured mix of the current tier). The expected union of experts of n
positions comes from recent routing (the RoutingObserver), with the union measured on a real
Qwen3-30B-A3B trace as the prior (FACTS: 1 / 1.61 / 2.16 / 2.96 / 4.19 / 5.72x one token's
experts for 1 / 2 / 3 / 5 / 9 / 17 positions). a, b, c are fitted online by least squares over
recent steps (robust to the steps another program preempted, each block of steps at its own
load level; refitted only when a draft is priced), pulled toward a prior made from
the bandwidth the experts backend measures, so the price follows the machine as it is now
(another program on the memory bus, a colder cache). The line is bent per step size by what
each size's steps ran over it (`_shape`): a dense verify's rows do not cost alike. Where the
probe (engine/verify_probe.py) measured this machine's curve, its steps stay in every fit beside the window's
(each at its own load level) and its per-size factors are the shape's prior: the run's own steps
correct each size they reach, and a size the run has not verified is priced as the probe measured.

Where a miss reads from the disk (the backend's `miss_seconds`), a step's seconds waited on reads
(`blocked_seconds`) are priced apart: the line is fitted to the compute (seconds less blocked),
and each expert a step routes beyond one position's costs the read time its verifies measured
(blocked seconds over a plain step's, per expert beyond one position's), from the backend's read
time at its bandwidth as the prior. A plain step's experts were mostly read ahead (the router's
guess of the next layer); a verify's extra rows' experts are demand reads it waits on. Priced as
the CPU's experts on the 48-layer disk tier, a verify of 1 / 3 / 5 drafts cost 1.2-1.5 / 1.7 / 3.0x
its price, and auto ran 0.7-0.8x plain (docs/benchmarks.md, spec34h).
"""
from __future__ import annotations

import itertools
import math
from collections import deque

import numpy as np

UNION_PRIOR = ((1, 1.0), (2, 1.61), (3, 2.16), (5, 2.96), (9, 4.19), (17, 5.72))
DEFAULT_EXPERT_RATE = 20e9      # bytes/s a CPU expert runs at when nothing was measured yet
MAX_TRACKED = 64                # positions per forward whose union is tracked
MISS_PRIOR_EXPERTS = 256.0      # the read-time prior's weight, in experts beyond one position's
MISS_DECAY = 0.98               # per verify: about the last 50 verifies set the read time


def _prior_union(n: int) -> float:
    """Union of n positions in units of one position's experts (log-linear between the points)."""
    pts = UNION_PRIOR
    if n <= 1:
        return 1.0
    for (n0, u0), (n1, u1) in zip(pts, pts[1:]):
        if n <= n1:
            t = (math.log(n) - math.log(n0)) / (math.log(n1) - math.log(n0))
            return u0 + t * (u1 - u0)
    n0, u0 = pts[-1]
    return u0 * (n / n0) ** 0.5


def _median(a: np.ndarray) -> np.ndarray:
    """np.median along the last axis (the same values: the middle element, or the mean of the
    two middle ones) by one sort: np.median's checks and partition cost ~50 us a call, and a fit
    takes ~90 of them (70% of its time; it runs inside a drafting step). The seconds it reads
    are finite (no NaN rule needed)."""
    s = np.sort(a, axis=-1)
    h = s.shape[-1] // 2
    return s[..., h] if s.shape[-1] % 2 else (s[..., h - 1] + s[..., h]) / 2


HUBER_K = 1.5          # residuals past 1.5 robust sigmas weigh less (Huber weights)
TUKEY_C = 4.685        # and past 4.7 robust sigmas nothing (Tukey's biweight)


def _nonnegative_ridge(X: np.ndarray, y: np.ndarray, wts: np.ndarray, w: float, phi0: np.ndarray) -> np.ndarray:
    """Weighted ridge toward phi0 with every coefficient >= 0, solved exactly: the best of the
    unconstrained solves over each subset of free coefficients (the rest held at 0) that stays
    non-negative (3 coefficients: 8 solves of the normal equations). Clipping an unconstrained
    fit instead left the others fitted for the negative one: -0.55 ms/position clipped to 0 on
    the trace-routed replay over-predicted every step by 0.55 ms a position (6-8%)."""
    Xw = X * wts[:, None]
    A = Xw.T @ X + w * np.eye(X.shape[1])      # the objective is phi'A phi - 2 phi'g + const
    g = Xw.T @ y + w * phi0
    phi = np.linalg.solve(A, g)
    if (phi >= 0).all():                       # the unconstrained optimum is feasible: it is the one
        return phi
    best, best_cost = np.zeros(X.shape[1]), 0.0
    for free in itertools.product((False, True), repeat=X.shape[1]):
        idx = np.flatnonzero(free)
        if not len(idx):
            continue
        phi = np.zeros(X.shape[1])
        phi[idx] = np.linalg.solve(A[np.ix_(idx, idx)], g[idx])
        cost = float(phi @ A @ phi - 2 * phi @ g)
        if (phi >= 0).all() and cost < best_cost:
            best, best_cost = phi, cost
    return best


GROUP_MIN = 3          # steps of one size group before its own median centres its residuals


def _size_groups(positions: np.ndarray) -> list[np.ndarray]:
    """Indices of the steps per size group (1, 2, 3-4, 5-8, 9-16, ... positions) that has
    GROUP_MIN steps or more."""
    g = np.frexp(np.maximum(positions - 1, 0))[1]      # 0 for 1 position, then 1, 2, 2, 3, 3, 3, 3, 4, ...
    out = []
    for v in sorted(set(g.tolist())):      # (np.unique imports numpy.ma on its first call: 22-250 ms)
        idx = np.flatnonzero(g == v)
        if len(idx) >= GROUP_MIN:
            out.append(idx)
    return out


def _robust_ridge(X: np.ndarray, y: np.ndarray, w: float, phi0: np.ndarray, rounds: int = 6,
                  groups: list[np.ndarray] | None = None) -> np.ndarray:
    """Ridge regression toward phi0, robustly reweighted (Huber, then Tukey): a step another
    program preempted runs milliseconds long, and the longer steps (the verifies) are preempted
    more often, so plain least squares charged each extra position part of the load's delays.
    `groups` (steps of similar size): each group's residuals are judged from its own median, so a
    delay is a step slow beside steps of its size; judged from the line, the first verifies of a
    machine whose rows cost 10x the prior's were each many sigmas off it and weighed nothing (on
    the AVX2 Zen 1 a row costs ~35% of a step against the prior's ~10%: up to 4 verifies of 9
    rows, or 8 of 2, left the price at the prior's; docs/benchmarks.md)."""
    wts = np.ones(len(y))
    for i in range(rounds):
        phi = _nonnegative_ridge(X, y, wts, w, phi0)
        r = y - X @ phi
        for idx in groups or ():
            r[idx] -= _median(r[idx])
        # y is in units of the cheapest step: 0.1% of it is the least spread believed
        sigma = max(1.4826 * float(_median(np.abs(r - _median(r)))), 1e-3)
        u = np.abs(r) / (sigma * (HUBER_K if i < rounds // 2 else TUKEY_C))
        # Huber weights first (convex: from least squares' start it finds the bulk), then
        # Tukey's (a step delayed by many sigmas weighs nothing: the delays are one-sided)
        wts = np.minimum(1.0, 1.0 / np.maximum(u, 1e-30)) if i < rounds // 2 else np.clip(1 - u * u, 0, 1) ** 2
    return phi


SHAPE_PRIOR = 4.0      # pseudo-steps on the line's side when a size's own median reshapes it


def _shape(positions: np.ndarray, ratio: np.ndarray) -> dict[int, float]:
    """Per step size n (1..MAX_TRACKED positions): the factor its steps ran over the fitted line
    (measured / predicted at their load level). A dense verify's cost is not a line in its rows:
    the GEMV's rows ride on one weight read up to ~5 rows, then cost their multiply-adds, in tile
    passes of 4-9 rows; the replay's steps cost 1.09 / 1.14 / 1.25 / 1.73 / 2.96 plain steps at
    1 / 3 / 4 / 8 / 16 drafts, where the line said 1.09 / 1.26 / 1.34 / 1.69 / 2.38
    (docs/benchmarks.md): short drafts priced dear, long ones cheap. The long verifies are rare
    (1-3 steps a size in a window), so a size's median is shrunk toward its size group's (1, 2,
    3-4, 5-8, 9-16, ...: the union of their steps), the group's toward the line, each by
    SHAPE_PRIOR pseudo-steps; a size not seen takes its seen neighbours' factors, interpolated."""
    n = positions.astype(np.int64)
    keep = (n >= 1) & (n <= MAX_TRACKED)
    n, ratio = n[keep], ratio[keep]
    if not len(n):
        return {}
    group = np.frexp(np.maximum(n - 1, 0))[1]
    sizes_seen = sorted(set(n.tolist()))
    med = {v: float(_median(ratio[n == v])) for v in sizes_seen}
    # the steps' own spread about their size's median: a median of m steps is trusted only past
    # its standard error (on a line that fits, the sizes' medians moved the price by ~2% alone)
    sigma = max(1.4826 * float(_median(np.abs(ratio - np.array([med[v] for v in n.tolist()])))), 1e-3)

    def toward(target: float, value: float, m: int) -> float:
        d = value - target
        d = np.sign(d) * max(abs(d) - 1.2533 * sigma / np.sqrt(m), 0.0)
        return target + float(d) * m / (m + SHAPE_PRIOR)
    seen, factor = [], []
    for g in sorted(set(group.tolist())):
        in_g = group == g
        level = toward(1.0, float(_median(ratio[in_g])), int(in_g.sum()))
        for v in sorted(set(n[in_g].tolist())):
            seen.append(v)
            factor.append(toward(level, med[v], int((n == v).sum())))
    sizes = np.arange(1, MAX_TRACKED + 1)
    return dict(zip(sizes.tolist(), np.interp(sizes, seen, factor).tolist()))


LEVEL_BLOCK = 16       # consecutive steps sharing one load level (the median of their measured / predicted)
LEVEL_PASSES = 2


def _levels_parts(ratio: np.ndarray, head: int) -> np.ndarray:
    """The load levels of the probe's steps (the first `head`) and of the window's, apart:
    measured at another time, they share no block of load. The probe's steps are one level
    (it put each size at its 1-position neighbours' level): in blocks, its steps (listed size
    by size) had each size's shape divided out as a level of its own, and the price read 16
    drafts at 0.70 of their measured cost."""
    if not head:
        return _levels(ratio)
    return np.concatenate([np.full(head, float(_median(ratio[:head]))), _levels(ratio[head:])])


def _probe_shape(positions: np.ndarray, ratio: np.ndarray) -> dict[int, float]:
    """Per step size 1..MAX_TRACKED: the probe's steps over the line (the median of each size
    it measured; sizes between its sizes interpolated, past its largest the largest's). Not
    shrunk: each size was timed in interleaved rounds, on purpose."""
    n = positions.astype(np.int64)
    seen = sorted(set(n.tolist()))
    med = [float(_median(ratio[n == v])) for v in seen]
    sizes = np.arange(1, MAX_TRACKED + 1)
    return dict(zip(sizes.tolist(), np.interp(sizes, seen, med).tolist()))


def _levels(ratio: np.ndarray) -> np.ndarray:
    """Each step's load level: the median of measured / predicted seconds over its block of
    LEVEL_BLOCK consecutive steps (blocks end at the newest step). Another program's load scales
    every step alike for a while, so the price's shape (what a position and an expert add to a
    step) is read from steps beside each other, not from steps minutes apart that ran on another
    share of the cores."""
    head = len(ratio) % LEVEL_BLOCK
    out = np.empty(len(ratio))
    if head:
        out[:head] = _median(ratio[:head])
    if len(ratio) > head:
        out[head:] = np.repeat(_median(ratio[head:].reshape(-1, LEVEL_BLOCK)), LEVEL_BLOCK)
    return out


class VerifyPrice:
    def __init__(self, moe_layers: int, top_k: int, num_experts: int, expert_nbytes: int,
                 expert_rate: float | None = None, window: int = 256, miss_s: float | None = None):
        """miss_s: seconds an expert's demand read takes (the backend's `miss_seconds`), None
        where a miss reads nothing: then blocked seconds are not priced apart."""
        self.L, self.top_k, self.E = moe_layers, top_k, max(num_experts, 1)
        self.miss_prior = miss_s if moe_layers and top_k else None
        self._one = moe_layers * top_k                      # one position's experts
        self._blocked_plain: deque = deque(maxlen=64)       # blocked seconds of steps of one position's experts
        self._miss_s_sum = self._miss_n = 0.0               # decayed: blocked seconds over a plain step's, experts beyond
        self.blocked_plain = 0.0        # a plain step's seconds waiting on reads (the median of recent ones)
        # seconds a step waits more per expert it routes beyond one position's: what the verifies
        # measured, shrunk toward the backend's read time (0 where a miss reads nothing)
        self.miss_s = miss_s or 0.0
        self.c0 = expert_nbytes / (expert_rate or DEFAULT_EXPERT_RATE) if moe_layers else 0.0
        self.samples: deque = deque(maxlen=window)         # (positions, experts, seconds)
        self.row_attention: deque = deque(maxlen=window)   # the decode attention's seconds per position
        self._union_sum = np.zeros(MAX_TRACKED + 1)        # per positions: sum of union ratios
        self._union_n = np.zeros(MAX_TRACKED + 1)
        self._theta: np.ndarray | None = None              # fitted (a, b, c): `theta` fits when stale
        self._coef = (1.0, 0.02, 0.0)                       # the same as floats (`seconds` reads them)
        self._by_size: dict[int, float] = {}                # per positions: its steps over the line (_shape)
        self._since_fit = 0
        self._unions: dict[int, float] = {}                 # union(n) since the last union sample
        self.probe: np.ndarray | None = None                # the probe's (positions, experts, seconds)
        self.probe_note = "off"                             # where they came from (set_probe)

    # --- what the engine measures --------------------------------------------------------
    def observe(self, positions: int, experts: int, seconds: float, attention: float = 0.0,
                blocked: float = 0.0) -> None:
        """One step: `positions` rows, `experts` distinct (layer, expert) pairs, `seconds` long,
        `attention` of them in the CPU decode attention kernel (0: not measured, e.g. on a GPU),
        `blocked` of them waiting on expert reads (priced apart where misses read: `miss_prior`)."""
        if self.miss_prior is not None:
            seconds = max(seconds - blocked, 0.0)
            beyond = experts - self._one
            if beyond <= 0:
                self._blocked_plain.append(blocked)
                self.blocked_plain = float(_median(np.array(self._blocked_plain)))
            else:
                self._miss_s_sum = self._miss_s_sum * MISS_DECAY + max(blocked - self.blocked_plain, 0.0)
                self._miss_n = self._miss_n * MISS_DECAY + beyond
            self.miss_s = (self._miss_s_sum + MISS_PRIOR_EXPERTS * self.miss_prior) / (self._miss_n + MISS_PRIOR_EXPERTS)
        self.samples.append((positions, experts, seconds))
        if attention > 0 and positions > 0:
            self.row_attention.append(attention / positions)
        if self.L and self.top_k and 1 <= positions <= MAX_TRACKED:
            self._union_sum[positions] += experts / (self.L * self.top_k)
            self._union_n[positions] += 1
            self._unions.clear()
        self._since_fit += 1

    def set_probe(self, steps, note: str = "") -> None:
        """The probe's measured steps (engine/verify_probe.py): in every fit from now on, as the
        shape's prior; `note`: where they came from (the bench prints it)."""
        self.probe = np.array(steps, dtype=np.float64).reshape(-1, 3) if steps else None
        self.probe_note = note
        self._theta = None

    @property
    def ready(self) -> bool:
        return len(self.samples) >= 4 or self.probe is not None

    @property
    def theta(self) -> np.ndarray | None:
        """The fitted (a, b, c), refitted when read after an eighth of the window (8 samples at
        least) is new: a fit costs 1-2 ms (measured; two passes), so refitting every 8 steps cost ~2% of
        a 17 ms step; only a step with a draft to price reads it, so steps that draft nothing do
        not pay for it at all."""
        self._refresh()
        return self._theta

    def _refresh(self) -> None:
        if (self.samples or self.probe is not None) and (self._theta is None or self._since_fit >= max(8, len(self.samples) // 8)):
            self._fit()

    @theta.setter
    def theta(self, value) -> None:
        self._theta, self._since_fit = value, 0
        self._coef = tuple(float(x) for x in value) if value is not None else (1.0, 0.02, 0.0)

    def union(self, n: int) -> float:
        """Expected distinct experts of n positions, one layer, in units of top_k: measured
        where there are samples (5 or more), else the prior scaled by what was measured."""
        n = int(round(n))
        if n <= 1:
            return 1.0
        if n <= MAX_TRACKED and self._union_n[n] >= 5:
            return self._union_sum[n] / self._union_n[n]
        # scale the prior's spread by the measured ratio at the nearest measured n
        ratio = 1.0
        for m in range(min(n, MAX_TRACKED), 1, -1):
            if self._union_n[m] >= 5:
                ratio = (self._union_sum[m] / self._union_n[m] - 1) / (_prior_union(m) - 1)
                break
        return min(1 + (_prior_union(n) - 1) * ratio, self.E / max(self.top_k, 1), float(n))

    def experts(self, n: int) -> float:
        if not self.L:
            return 0.0
        u = self._unions.get(n)
        if u is None:
            u = self._unions[n] = self.union(n)
        return self.L * self.top_k * u

    # --- the model ---------------------------------------------------------------------
    def _fit(self) -> None:
        self._since_fit = 0
        s = np.array(self.samples, dtype=np.float64).reshape(-1, 3)
        m = 0 if self.probe is None else len(self.probe)      # the probe's steps lead the window's
        if m:
            s = np.concatenate([self.probe, s])
        if len(s) == 0:
            return
        ones = s[:, 0] == s[:, 0].min()
        t1 = float(_median(s[ones, 2]))                    # the cheapest steps seen
        u1 = float(_median(s[ones, 1]))
        n1 = float(s[ones, 0].min())
        c0 = min(self.c0, 0.9 * t1 / max(u1, 1.0))          # the prior never says experts cost more than a step
        # dense rows ride on the weights' one read, but each row runs its own attention over its
        # keys (a verify row shares the key blocks' reads, not the multiply-adds): at 4096 keys a
        # row's attention was 15% of a plain step on the medium MoE, and its first drafts, priced
        # at 2% a row, made the first 16 tokens 1.3x slower (docs/benchmarks.md)
        att = float(_median(np.array(self.row_attention))) if self.row_attention else 0.0
        b0 = 0.02 * t1 + min(att, 0.9 * t1)
        a0 = max(t1 - c0 * u1 - b0 * n1, 0.05 * t1)
        prior = np.array([a0, b0, c0])
        scale = np.array([t1, t1, t1 / max(u1, 1.0)])      # the prior's spread per parameter
        w = 2.0                                               # its weight, in samples
        # ridge regression in units of the prior's spread (phi = theta / scale), seconds in units of t1
        X = np.column_stack([np.ones(len(s)), s[:, 0], s[:, 1]]) * scale / t1
        y = s[:, 2] / t1
        # each step's seconds divided by its block's load level, the level read with the prior's
        # shape, then again with the fitted one: under other programs' load the plain step's time
        # moved 5x within a window, the verifies landed unevenly in it, and one fit over the whole
        # window read 9-19% of a step a position where steps side by side said ~2% (the dense
        # replay, docs/benchmarks.md). Both passes robust: a block that straddles a change of load
        # is an outlier in either level, and a least-squares first pass carried it into the second
        phi = prior / scale
        groups = _size_groups(s[:, 0])
        for _ in range(LEVEL_PASSES):
            level = _levels_parts(y / np.maximum(X @ phi, 1e-9), m)
            phi = _robust_ridge(X, y / level, w, prior / scale, groups=groups)
        # what each step size ran over the line, at its block's level
        fitted = np.maximum(X @ phi, 1e-9)
        ratio = y / fitted
        r = ratio / _levels_parts(ratio, m)
        if m:       # the window's steps correct the probe's shape (each size toward the probe's factor)
            prior = _probe_shape(s[:m, 0], r[:m])
            own = s[m:, 0]
            at = np.array([prior.get(int(n), 1.0) for n in own])
            corr = _shape(own, r[m:] / at)
            shape = {n: f * corr.get(n, 1.0) for n, f in prior.items()}
        else:
            shape = _shape(s[:, 0], r)
        # seconds at today's level: the newest two blocks' measured over fitted (shaped)
        per = np.array([shape.get(int(n), 1.0) for n in s[:, 0]])
        now = float(_median((ratio / per)[-2 * LEVEL_BLOCK:]))
        self.theta = phi * scale * now
        self._by_size = shape

    def seconds(self, positions: int, experts: float | None = None) -> float:
        """Predicted step seconds for `positions` rows (their expected union when not given).
        Read 2 x k times a proposal while drafting (decide.py): from floats and a cached union
        (numpy scalars, and the union's search recomputed each time, made it ~10 us a read, a
        third of the speculator's ~0.4 ms on a step that drafts)."""
        self._refresh()
        a, b, c = self._coef
        e = self.experts(positions) if experts is None else experts
        t = (a + b * positions + c * e) * self._by_size.get(int(round(positions)), 1.0)
        if self.miss_prior is not None:
            t += self.blocked_plain + self.miss_s * max(e - self._one, 0.0)
        return t
