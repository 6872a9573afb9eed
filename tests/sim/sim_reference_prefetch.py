"""Brute-force reference of the prefetching policies (`lru+prefetch`, `lrfu+admit+prefetch`):
lists and scans, the predictor recounted from the whole history of decode cells.

Per access like ``sim_reference``'s models; after each decode cell, the guesses for the next
layer (mean over the cell's experts of P(b | a), from all earlier consecutive-layer cell pairs,
>= the threshold, likeliest first then lower id) that are not resident are copied in: empty
slots first, then the policy's victims (lowest score, least recent), each taking the MRU end.
"""

from __future__ import annotations

from freetoken.experts.memory.next_layer import THRESHOLD

from sim_reference import DECODE, PREFILL


def ref_guess(history, layer, experts, L, E, threshold=THRESHOLD):
    """history: [(layer, sorted expert ids)] of decode cells so far (this one last)."""
    if layer + 1 >= L or not experts:
        return []
    pairs, seen = {}, {}
    for (l0, a_set), (l1, b_set) in zip(history, history[1:]):
        if l0 != layer or l1 != l0 + 1:
            continue
        for a in a_set:
            seen[a] = seen.get(a, 0) + 1
            for b in b_set:
                pairs[(a, b)] = pairs.get((a, b), 0) + 1
    p = {b: sum(pairs.get((a, b), 0) / max(seen.get(a, 0), 1) for a in experts) / len(experts) for b in range(E)}
    guess = [b for b in range(E) if p[b] >= threshold - 1e-9]
    return sorted(guess, key=lambda b: (-p[b], b))


def ref_prefetch(stream, slots, policy="lru", admit=False, half_life=32.0):
    """policy: 'lru' or 'lrfu'."""
    L, E = stream.num_layers, stream.num_experts
    cache, last, hist, out = [], {}, {}, []
    history, clock, token, prev_layer = [], 0, 0, -1

    def score(x):
        if policy == "lru":
            return 0.0
        return sum(0.5 ** ((token - s) / half_life) for s in hist.get(x, []))

    def victim():
        return min(cache, key=lambda x: (score(x), last[x]))

    for seg in stream.segments:
        for cell in seg.cells:
            for k in cell:
                clock += 1
                if policy == "lrfu":
                    if k // E < prev_layer:
                        token += 1
                    prev_layer = k // E
                    hist.setdefault(k, []).append(token)
                hit = k in cache
                if not hit and slots:
                    if len(cache) == slots:
                        v = victim()
                        if admit and seg.phase != PREFILL and policy == "lrfu" and not score(k) > score(v) * (1 + 1e-12):
                            out.append((seg.phase, hit))
                            continue
                        cache.remove(v)
                    cache.append(k)
                if k in cache:
                    last[k] = clock
                out.append((seg.phase, hit))
            if seg.phase != DECODE or not cell:
                continue
            layer = cell[0] // E
            history.append((layer, [k - layer * E for k in cell]))
            want = [(layer + 1) * E + b for b in ref_guess(history, layer, history[-1][1], L, E)]
            want = [w for w in want if w not in cache]
            free = slots - len(cache)
            victims = sorted(cache, key=lambda x: (score(x), last[x]))[:max(0, len(want) - free)]
            want = want[:free + len(victims)]
            for v in victims:
                cache.remove(v)
            for w in want:
                clock += 1
                cache.append(w)
                last[w] = clock
    return out
