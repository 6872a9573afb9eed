"""Brute-force reference models of every policy: lists, scans and exhaustive search.

Each returns [(phase, hit), ...] for every access of the stream, like ``replay_hits``
(except ``optimal_decode_misses``, which returns the minimum decode miss count).
"""

from __future__ import annotations

import itertools
from functools import lru_cache

from freetoken.sim.trace import DECODE, PREFILL


def accesses(stream):
    """(phase, key, free point after this access?) in order; free points also at the start."""
    out = []
    for seg in stream.segments:
        keys = seg.keys()
        for i, k in enumerate(keys):
            out.append((seg.phase, k, seg.phase == PREFILL and i == len(keys) - 1))
    return out


def _lru_access(cache: list, k, cap: int) -> bool:
    """One access to a list-ordered LRU of capacity cap (oldest first); returns hit."""
    hit = k in cache
    if hit:
        cache.remove(k)
    elif len(cache) == cap and cap:
        cache.pop(0)
    if cap:
        cache.append(k)
    return hit


def ref_lru(stream, slots):
    cache = []
    return [(phase, _lru_access(cache, k, slots)) for phase, k, _ in accesses(stream)]


def ref_per_layer_lru(stream, slots):
    L, E = stream.num_layers, stream.num_experts
    shares = [slots // L + (1 if l < slots % L else 0) for l in range(L)]
    caches = [[] for _ in range(L)]
    out = []
    for phase, k, _ in accesses(stream):
        out.append((phase, _lru_access(caches[k // E], k, shares[k // E])))
    return out


def ref_lfu(stream, slots, admit=False):
    """admit: a miss replaces the victim only when its count is higher (else it bypasses)."""
    count, last, cache, out = {}, {}, [], []
    for t, (phase, k, _) in enumerate(accesses(stream)):
        count[k] = count.get(k, 0) + 1
        hit = k in cache
        if not hit and slots:
            if len(cache) == slots:
                victim = min(cache, key=lambda x: (count[x], last[x]))
                if admit and phase != "prefill" and not count[k] > count[victim]:
                    last[k] = t
                    out.append((phase, hit))
                    continue
                cache.remove(victim)
            cache.append(k)
        last[k] = t
        out.append((phase, hit))
    return out


def ref_static(stream, slots):
    L, E = stream.num_layers, stream.num_experts
    order = [l * E + e for l in reversed(range(L)) for e in range(E)]
    resident = set(order[:slots])
    return [(phase, k in resident) for phase, k, _ in accesses(stream)]


def ref_hot(stream, slots):
    L, E = stream.num_layers, stream.num_experts

    def pin(counts):
        ranked = sorted(range(L * E), key=lambda k: (-counts.get(k, 0), k))
        return set(ranked[:slots])

    pinned, out = pin({}), []
    for seg in stream.segments:
        out += [(seg.phase, k in pinned) for k in seg.keys()]
        if seg.phase == PREFILL:
            pinned = pin(seg.prompt_counts)
    return out


def ref_arc(stream, c, admit=False):
    """Megiddo & Modha's ARC, transcribed with plain lists (LRU end first). admit: with the
    cache full, a decode miss in no list is not filled but remembered in B1 (bypass)."""
    t1, t2, b1, b2, p, out = [], [], [], [], 0.0, []

    def replace(x):
        nonlocal p
        if t1 and (len(t1) > p or (x in b2 and len(t1) == p) or not t2):
            b1.append(t1.pop(0))
        else:
            b2.append(t2.pop(0))

    for phase, x, _ in accesses(stream):
        if c == 0:
            out.append((phase, False))
            continue
        if x in t1 or x in t2:
            (t1 if x in t1 else t2).remove(x)
            t2.append(x)
            out.append((phase, True))
            continue
        if x in b1:
            p = min(float(c), p + max(len(b2) / len(b1), 1.0))
            replace(x)
            b1.remove(x)
            t2.append(x)
        elif x in b2:
            p = max(0.0, p - max(len(b1) / len(b2), 1.0))
            replace(x)
            b2.remove(x)
            t2.append(x)
        elif admit and phase != "prefill" and len(t1) + len(t2) == c:
            b1.append(x)
            while len(t1) + len(b1) > c:
                b1.pop(0)
            while len(t1) + len(t2) + len(b1) + len(b2) > 2 * c:
                b2.pop(0)
        else:
            if len(t1) + len(b1) == c:
                if len(t1) < c:
                    b1.pop(0)
                    replace(x)
                else:
                    t1.pop(0)
            elif len(t1) + len(b1) < c and len(t1) + len(t2) + len(b1) + len(b2) >= c:
                if len(t1) + len(t2) + len(b1) + len(b2) == 2 * c:
                    b2.pop(0)
                replace(x)
            t1.append(x)
        out.append((phase, False))
    return out


def decode_runs(stream):
    runs = [[]]
    for seg in stream.segments:
        if seg.phase == DECODE:
            runs[-1] += seg.keys()
        else:
            runs.append([])
    return runs


def optimal_decode_misses(stream, slots):
    """Exhaustive search: free placement at each free point, optional admission on a miss."""
    total = 0
    for run in decode_runs(stream):
        keys = sorted(set(run))
        seq = tuple(run)

        @lru_cache(maxsize=None)
        def best(i, state):
            if i == len(seq):
                return 0
            x = seq[i]
            if x in state:
                return best(i + 1, state)
            options = [best(i + 1, state)]  # bypass
            if len(state) < slots:
                options.append(best(i + 1, state | {x}))
            for y in state:
                options.append(best(i + 1, (state - {y}) | {x}))
            return 1 + min(options)

        starts = [frozenset(s) for r in range(min(slots, len(keys)) + 1) for s in itertools.combinations(keys, r)]
        total += min(best(0, s) for s in starts)
    return total


def ref_lrfu(stream, slots, half_life=32.0, admit=False):
    """Scores recomputed from each entry's whole access history at every eviction; admit: a
    miss replaces the victim only when its score is higher (else it bypasses)."""
    E = stream.num_experts
    history, cache, out, last, token, prev_layer = {}, [], [], {}, 0, -1
    for t, (phase, k, _) in enumerate(accesses(stream)):
        if k // E < prev_layer:
            token += 1
        prev_layer = k // E
        history.setdefault(k, []).append(token)
        hit = k in cache
        if not hit and slots:
            if len(cache) == slots:
                score = lambda x: sum(0.5 ** ((token - s) / half_life) for s in history[x])  # noqa: E731
                victim = min(cache, key=lambda x: (score(x), last[x]))
                if admit and phase != "prefill" and not score(k) > score(victim) * (1 + 1e-12):
                    last[k] = t
                    out.append((phase, hit))
                    continue
                cache.remove(victim)
            cache.append(k)
        last[k] = t
        out.append((phase, hit))
    return out


def optimal_on_use_misses(stream, slots):
    """Exhaustive search, fetch-on-use model: the cache starts empty and persists; an entry
    may enter only at an access to it (prefill accesses free), evicting any resident."""
    seq = tuple((k, phase == DECODE) for phase, k, _ in accesses(stream))

    @lru_cache(maxsize=None)
    def best(i, state):
        if i == len(seq):
            return 0
        x, decode = seq[i]
        if x in state:
            return best(i + 1, state)
        options = [best(i + 1, state)]  # bypass
        if len(state) < slots:
            options.append(best(i + 1, state | {x}))
        for y in state:
            options.append(best(i + 1, (state - {y}) | {x}))
        return int(decode) + min(options)

    return best(0, frozenset())
