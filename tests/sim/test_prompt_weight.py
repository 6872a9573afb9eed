"""'+prompt' (prompt-weighted frequency): the shares against a float64 loop over the prompt's
tokens, the table's counts, and the replayed policy against a brute-force LRFU whose prefill
accesses weigh their share (whole access histories rescored at every eviction)."""
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken.experts.memory.prompt_weight import prompt_shares
from freetoken.experts.memory.slots import DEFAULT_POLICY, SlotTable, parse_policy_options
from freetoken.sim.access import AccessStream, Segment
from freetoken.sim.replay import replay, replay_hits
from freetoken.sim.policies import POLICIES
from freetoken.sim.trace import DECODE, PREFILL


def loop_shares(rows, E, half_life):
    """Each expert's share, one token at a time: sum of 0.5^(age/half_life) over the tokens that
    routed it, over the same sum over every token."""
    T = len(rows)
    total = sum(0.5 ** ((T - 1 - i) / half_life) for i in range(T))
    return [sum(0.5 ** ((T - 1 - i) / half_life) for i, r in enumerate(rows) if e in r) / total for e in range(E)]


token_rows = st.integers(1, 6).flatmap(lambda E: st.integers(1, E).flatmap(lambda k: st.tuples(
    st.just(E), st.lists(st.lists(st.integers(0, E - 1), min_size=k, max_size=k, unique=True), min_size=1, max_size=12))))


@settings(max_examples=100, deadline=None)
@given(er=token_rows, half_life=st.sampled_from([1.0, 4.0, 32.0]))
def test_shares_match_a_loop_over_the_tokens(er, half_life):
    E, rows = er
    got = prompt_shares(np.array(rows), E, half_life)
    assert np.allclose(got, loop_shares(rows, E, half_life), rtol=1e-12, atol=0)
    assert ((got >= 0) & (got <= 1 + 1e-12)).all()
    every = set.intersection(*map(set, rows))
    assert all(abs(got[e] - 1) < 1e-12 for e in every)


def test_table_adds_the_share_once_then_whole_accesses():
    E, h = 4, 32.0
    t = SlotTable(2 * E, E, 3, "lrfu+prompt", half_life=h)
    rows = np.array([[0, 1], [1, 2], [1, 3]])
    t.learn_prompt(1, rows)
    ids = np.array([E + 0, E + 1, E + 2, E + 3])
    t.record(ids)
    assert np.allclose(t.count[ids], loop_shares(rows.tolist(), E, h))
    t.record(np.array([0]))                   # layer 0 < 1: the next token
    t.record(ids[:1])                         # a decode access adds 1 after one token's decay
    assert np.isclose(t.count[E], loop_shares(rows.tolist(), E, h)[0] * 0.5 ** (1 / h) + 1)
    t.learn_prompt(0, np.array([[2]]))        # shares not recorded are dropped by the next call's
    t.learn_prompt(1, np.array([[3]]))
    t.record(np.array([2]))                   # layer 0's share is gone: a whole access
    assert np.isclose(t.count[2], 1.0)


def test_parse():
    assert parse_policy_options(DEFAULT_POLICY) == ("lrfu", True, True)
    for bad in ("lfu+prompt", "lru+prompt", "arc+prompt", "lrfu+prompt+admit"):
        with pytest.raises(ValueError, match="prompt"):
            parse_policy_options(bad)


@st.composite
def prompted_streams(draw):
    """A prompt (per-token rows, each layer's cell their union) then decode tokens through
    every layer, optionally a second prompt and its decode."""
    L, E = draw(st.integers(1, 3)), draw(st.integers(2, 4))
    k = draw(st.integers(1, E))
    row = st.lists(st.integers(0, E - 1), min_size=k, max_size=k, unique=True).map(sorted)
    segs = []
    for _ in range(draw(st.integers(1, 2))):
        T = draw(st.integers(1, 6))
        rows = [[draw(row) for _ in range(T)] for _ in range(L)]
        cells = tuple(tuple(sorted({l * E + e for r in rows[l] for e in r})) for l in range(L))
        counts = Counter(l * E + e for l in range(L) for r in rows[l] for e in r)
        segs.append(Segment(PREFILL, cells, tuple(range(L)), counts, rows=tuple(tuple(map(tuple, r)) for r in rows)))
        n = draw(st.integers(1, 5))
        dec = tuple(tuple(l * E + e for e in draw(row)) for _ in range(n) for l in range(L))
        segs.append(Segment(DECODE, dec, tuple(c[0] // E for c in dec)))
    return AccessStream(L, E, tuple(segs))


def ref_lrfu_prompt(stream, slots, admit, half_life=32.0):
    """LRFU by whole histories of (token, weight): a prefill access weighs its expert's share
    of the prompt (loop_shares), a decode access 1; admit: a decode miss replaces the victim
    only when its score is higher."""
    E = stream.num_experts
    history, cache, out, last, token, prev, t = {}, [], [], {}, 0, -1, 0
    for seg in stream.segments:
        for i, cell in enumerate(seg.cells):
            share = loop_shares([list(r) for r in seg.rows[i]], E, half_life) if seg.phase == PREFILL else None
            for k in cell:
                if k // E < prev:
                    token += 1
                prev = k // E
                history.setdefault(k, []).append((token, 1.0 if share is None else share[k % E]))
                score = lambda x: sum(w * 0.5 ** ((token - s) / half_life) for s, w in history[x])  # noqa: E731
                hit = k in cache
                if not hit and slots:
                    if len(cache) == slots:
                        victim = min(cache, key=lambda x: (score(x), last[x]))
                        if admit and seg.phase == DECODE and not score(k) > score(victim) * (1 + 1e-12):
                            last[k], t = t, t + 1
                            out.append((seg.phase, hit))
                            continue
                        cache.remove(victim)
                    cache.append(k)
                last[k], t = t, t + 1
                out.append((seg.phase, hit))
    return out


@pytest.mark.parametrize("name,admit", [("lrfu+prompt", False), ("lrfu+admit+prompt", True)])
@settings(max_examples=60, deadline=None)
@given(stream=prompted_streams(), slots=st.integers(0, 7))
def test_replay_matches_brute_force(name, admit, stream, slots):
    got = replay_hits(POLICIES[name](slots, stream.num_layers, stream.num_experts), stream)
    assert got == ref_lrfu_prompt(stream, slots, admit)


@settings(max_examples=60, deadline=None)
@given(stream=prompted_streams(), slots=st.integers(0, 9))
def test_no_prompt_weighted_policy_beats_belady(stream, slots):
    """(Without prefetch: a copy ahead at every layer may beat belady's placements.)"""
    bound = replay("belady", stream, slots).misses
    for name in ("lrfu+prompt", "lrfu+admit+prompt"):
        assert replay(name, stream, slots).misses >= bound, name
    assert replay("lrfu+admit+prompt", stream, slots).misses >= replay("belady-on-use", stream, slots).misses


def test_the_default_reports_prompt_weighting():
    """/v1/memory's device cache (stats.tier_summary) names the default policy and its switch;
    /metrics (flatten) exports the switch as a number."""
    from freetoken.experts.measure.stats import tier_summary
    from freetoken.server.operations.metrics import flatten
    t = SlotTable(8, 4, 2)
    stats = {"backend": "hybrid", "total": {}, "cache": {"slots": 2, **t.describe()}}
    cache = tier_summary(stats)["device_cache"]
    assert cache["policy"] == DEFAULT_POLICY and cache["prompt_weighted"] == 1 and cache["path_hops"] == 2
    assert flatten(stats)[("cache_prompt_weighted", None)] == 1.0
    assert flatten(stats)[("cache_path_hops", None)] == 2.0        # '+path' on 2 layers: 2 hops, not 4
