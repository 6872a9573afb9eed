"""The drafters' confidence buckets and the acceptance statistics kept per bucket, against
brute-force computations on drawn histories: a drafter's proposal and bucket are those of a
search of the whole sequence (the longest matched suffix, the count agreeing on the first token,
the majority walk), drafted at the lengths a run of verifies reaches; the statistics' rates are
the decayed counts of each bucket's own drafts alone."""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from freetoken.engine.spec import acceptance
from freetoken.engine.spec.acceptance import AcceptanceStats
from freetoken.engine.spec.drafters import NUM_BUCKETS, match_bucket
from freetoken.engine.spec.ngram import NgramDrafter
from freetoken.engine.spec.suffix import MIN_AGREE, ORDERS, SuffixDrafter


def _suffix_reference(ctx, k):
    """Brute-force suffix walk over one sequence (every occurrence, no index): (tokens, matched
    length, first token's count)."""
    for n in sorted(ORDERS, reverse=True):
        if n > len(ctx):
            continue
        occ = [p for p in range(n, len(ctx)) if ctx[p - n:p] == ctx[-n:]]
        if not occ:
            continue
        out, first_count = [], 0
        for i in range(k):
            nxt = Counter(ctx[p + i] for p in occ if p + i < len(ctx))
            if not nxt:
                break
            tok, cnt = nxt.most_common(1)[0]
            if cnt < MIN_AGREE * len(occ):
                break
            if i == 0:
                first_count = cnt
            out.append(tok)
            occ = [p for p in occ if p + i < len(ctx) and ctx[p + i] == tok]
        return (tuple(out), n, first_count) if out else None
    return None


def _ngram_reference(ctx, k, orders):
    """Brute-force prompt lookup: (continuation, order) of the latest earlier occurrence."""
    for n in sorted(orders, reverse=True):
        if n > len(ctx):
            continue
        for p in range(len(ctx) - 1, n - 1, -1):
            if ctx[p - n:p] == ctx[-n:]:
                return tuple(ctx[p:p + k]), n
    return None


def _steps(tokens, advances):
    """The lengths a sequence is drafted at: each step emits 1 + some accepted tokens."""
    n, out = 4, []
    for a in advances:
        if n >= len(tokens):
            break
        out.append(n)
        n += a
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=8, max_size=90),
       st.lists(st.integers(1, 6), min_size=1, max_size=60), st.integers(1, 8))
def test_suffix_buckets_are_the_brute_force_ones(tokens, advances, k):
    d = SuffixDrafter(per_key=1 << 20)         # every occurrence, as the reference
    for n in _steps(tokens, advances):
        ctx = tokens[:n]
        d.observe("s", ctx)
        got = d.propose(ctx, k, key="s")
        want = _suffix_reference(ctx, k)
        if want is None:
            assert got is None
        else:
            toks, m, count = want
            assert got.tokens == toks
            assert got.bucket == match_bucket(m, count)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=8, max_size=90),
       st.lists(st.integers(1, 6), min_size=1, max_size=60), st.integers(1, 8))
def test_ngram_buckets_are_the_brute_force_ones(tokens, advances, k):
    d = NgramDrafter()
    for n in _steps(tokens, advances):
        ctx = tokens[:n]
        d.observe("s", ctx, 0)
        got = d.propose(ctx, k, key="s")
        want = _ngram_reference(ctx, k, d.orders)
        if want is None or not want[0]:
            assert got is None
        else:
            assert got.tokens == want[0]
            assert got.bucket == match_bucket(want[1], 1)


def test_buckets_are_distinct():
    seen = {match_bucket(m, c) for m in (1, 3, 8, 20) for c in (1, 2, 9)}
    assert seen == set(range(NUM_BUCKETS))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 6), st.integers(0, 6)), max_size=120),
       st.floats(0.9, 1.0))
def test_statistics_are_each_buckets_decayed_counts(drafts, decay):
    """Each bucket's rate at position i: (sum over its drafts that reached i, weighted by decay ^
    (its drafts since), of whether i was accepted + prior) / (their weight + prior weight);
    the other buckets' drafts leave it alone."""
    old = acceptance.DECAY
    acceptance.DECAY = decay
    try:
        K = 6
        stats = AcceptanceStats(K)
        for b, drafted, acc in drafts:
            stats.observe("d", b, drafted, min(acc, drafted))
    finally:
        acceptance.DECAY = old
    for b in range(3):
        mine = [(n, min(a, n)) for bb, n, a in drafts if bb == b]
        want, run, total = [0.0], 1.0, 0.0
        for i in range(K):
            tried = acc = 0.0
            for age, (n, a) in enumerate(reversed(mine)):
                if i < n and i <= a:                  # the draft reached token i
                    tried += decay ** age
                    acc += decay ** age * (i < a)
            prior = acceptance.PRIOR_FIRST if i == 0 else acceptance.PRIOR_NEXT
            rate = (acc + acceptance.PRIOR_WEIGHT * prior) / (tried + acceptance.PRIOR_WEIGHT)
            run *= rate
            total += run
            want.append(total)
        assert stats.expected_accepted("d", b, K) == pytest.approx(want, rel=1e-9, abs=1e-12)
