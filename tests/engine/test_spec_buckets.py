"""The drafters' confidence buckets and the acceptance statistics kept per bucket, against
brute-force computations on drawn histories: a drafter's bucket holds the matched length, the
count agreeing on the first token, whether its proposal at the sequence's previous drafting step
held (searched again from the test's own record of the proposals and the tokens emitted since),
and where the suffix walk's occurrences first split; the statistics' rates are the decayed
counts of each bucket's own drafts alone."""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from freetoken.engine.spec import acceptance
from freetoken.engine.spec.acceptance import AcceptanceStats
from freetoken.engine.spec.drafters import MISSED, NO_STREAK, NUM_BUCKETS, PREDICTED, match_bucket, split_band
from freetoken.engine.spec.ngram import NgramDrafter
from freetoken.engine.spec.suffix import MIN_AGREE, ORDERS, SuffixDrafter


def _streak(previous, ctx):
    """Brute force: the proposal (length it was made at, tokens) against each token since."""
    if previous is None:
        return NO_STREAK
    n0, toks = previous
    since = ctx[n0:]
    if not since:
        return NO_STREAK
    for i in range(min(len(toks), len(since))):
        if toks[i] != since[i]:
            return MISSED
    return PREDICTED


def _suffix_reference(ctx, k):
    """Brute-force suffix walk over one sequence (every occurrence, no index): (tokens, matched
    length, first token's count, index of the first token the occurrences split on)."""
    for n in sorted(ORDERS, reverse=True):
        if n > len(ctx):
            continue
        occ = [p for p in range(n, len(ctx)) if ctx[p - n:p] == ctx[-n:]]
        if not occ:
            continue
        out, first_count, first_split = [], 0, None
        for i in range(k):
            nxt = Counter(ctx[p + i] for p in occ if p + i < len(ctx))
            if not nxt:
                break
            tok, cnt = nxt.most_common(1)[0]
            if cnt < MIN_AGREE * len(occ):
                break
            if i == 0:
                first_count = cnt
            if first_split is None and any(p + i >= len(ctx) or ctx[p + i] != tok for p in occ):
                first_split = i
            out.append(tok)
            occ = [p for p in occ if p + i < len(ctx) and ctx[p + i] == tok]
        return (tuple(out), n, first_count, first_split) if out else None
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
    previous = None
    for n in _steps(tokens, advances):
        ctx = tokens[:n]
        d.observe("s", ctx)
        got = d.propose(ctx, k, key="s")
        want = _suffix_reference(ctx, k)
        if want is None:
            assert got is None
        else:
            toks, m, count, split = want
            assert got.tokens == toks
            assert got.bucket == match_bucket(m, count, _streak(previous, ctx), split_band(split))
        previous = (n, got.tokens) if got is not None else None


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=8, max_size=90),
       st.lists(st.integers(1, 6), min_size=1, max_size=60), st.integers(1, 8))
def test_ngram_buckets_are_the_brute_force_ones(tokens, advances, k):
    d = NgramDrafter()
    previous = None
    for n in _steps(tokens, advances):
        ctx = tokens[:n]
        d.observe("s", ctx, 0)
        got = d.propose(ctx, k, key="s")
        want = _ngram_reference(ctx, k, d.orders)
        if want is None or not want[0]:
            assert got is None
        else:
            assert got.tokens == want[0]
            assert got.bucket == match_bucket(want[1], 1, _streak(previous, ctx))
        previous = (n, got.tokens) if got is not None else None


def test_buckets_are_distinct_and_a_forgotten_sequence_has_no_streak():
    seen = {match_bucket(m, c, s, b) for m in (1, 3, 8, 20) for c in (1, 2, 9)
            for s in (NO_STREAK, MISSED, PREDICTED) for b in range(5)}
    assert seen == set(range(NUM_BUCKETS))
    d = SuffixDrafter()
    ctx = [1, 2, 3, 4, 1, 2, 3]
    d.observe("a", ctx)
    first = d.propose(ctx, 3, key="a")
    d.observe("a", ctx + [4])
    assert d.propose(ctx + [4], 3, key="a").bucket == match_bucket(4, 1, PREDICTED, split_band(None))
    assert first.bucket == match_bucket(3, 1, NO_STREAK, split_band(None))
    d.forget("a")
    assert d.propose(ctx + [4], 3, key="a").bucket % (3 * 5) // 5 == NO_STREAK


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
