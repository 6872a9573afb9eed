"""The parts of speculative decoding on their own: drafters against brute-force searches, the
suffix index's sharing and memory bound, the acceptance statistics, the verify price."""
from __future__ import annotations

import random

import numpy as np
import pytest

from freetoken.engine.spec.acceptance import AcceptanceStats
from freetoken.engine.spec.ngram import NgramDrafter
from freetoken.engine.spec.price import UNION_PRIOR, VerifyPrice
from freetoken.engine.spec.suffix import SuffixDrafter


def _repetitive(n, seed, alphabet=12):
    """Text-like tokens: random phrases from a small phrase book, so n-grams recur."""
    r = random.Random(seed)
    book = [[r.randrange(alphabet) for _ in range(r.randint(2, 7))] for _ in range(20)]
    out = []
    while len(out) < n:
        out += r.choice(book)
    return out[:n]


def _last_occurrence_continuation(ctx, k, orders):
    """Brute force prompt lookup: the longest order whose n-gram occurs earlier; its latest
    occurrence's continuation."""
    for n in sorted(orders, reverse=True):
        if n > len(ctx):
            continue
        tail = ctx[-n:]
        for p in range(len(ctx) - 1, n - 1, -1):      # occurrence ending before p, p < len(ctx)
            if ctx[p - n:p] == tail:
                return ctx[p:p + k]
    return None


def test_ngram_drafter_is_prompt_lookup():
    d = NgramDrafter()
    for seed in range(30):
        toks = _repetitive(120, seed)
        for cut in range(10, 120, 7):
            ctx = toks[:cut]
            d.observe("s", ctx, 0)
            got = d.propose(ctx, 5, key="s")
            want = _last_occurrence_continuation(ctx, 5, d.orders)
            assert (list(got.tokens) if got else None) == (want or None), (seed, cut)
        d.forget("s")


def test_suffix_drafter_shares_sessions_and_walks_the_majority():
    d = SuffixDrafter()
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    d.observe("a", a)
    d.forget("a")
    # another session that ends with a's head continues as a did
    got = d.propose([50, 51, 1, 2, 3], 4, key="b")
    assert got.tokens == (4, 5, 6, 7)
    # two occurrences disagree after "4 5": the walk stops where fewer than half agree
    d.observe("c", [1, 2, 3, 4, 5, 99, 98])
    d.observe("e", [1, 2, 3, 4, 5, 6, 40])
    got = d.propose([7, 1, 2, 3], 6, key="f")
    assert got.tokens[:2] == (4, 5) and len(got.tokens) >= 2
    # the most recent turn of a session continues its stream instead of indexing it again
    turn = list(range(100, 112))
    d.observe("t1", turn)
    d.forget("t1")
    total = d.total
    d.observe("t2", turn + [7, 8])
    assert d.total == total + 2


def test_suffix_drafter_memory_is_bounded():
    d = SuffixDrafter(max_tokens=500)
    for s in range(40):
        d.observe(s, _repetitive(100, s, alphabet=1000))
        d.forget(s)
    assert d.total <= 500 + 100
    assert sum(len(st.tokens) for st in d.streams.values()) == d.total
    # what remains still drafts: the newest session's phrases
    last = _repetitive(100, 39, alphabet=1000)
    assert d.propose(last[:30], 4, key="x") is not None


def test_acceptance_statistics_expected_length():
    st = AcceptanceStats(4)
    for _ in range(2000):                 # first token accepted 1 in 2, then always
        st.observe("d", 0, 4, 4)
        st.observe("d", 0, 4, 0)
    exp = st.expected_accepted("d", 0, 4)
    assert exp[0] == 0
    assert exp[1] == pytest.approx(0.5, abs=0.02)
    assert exp[4] == pytest.approx(0.5 * 4, abs=0.1)
    assert st.summary()["d"]["mean_accepted_length"] == pytest.approx(2.0)


def test_price_recovers_a_known_cost_model():
    """Steps timed as a + b*positions + c*experts (plus noise): the fit predicts new steps
    within 5%, the union prior reproduces the measured Qwen3 trace's curve."""
    rng = np.random.default_rng(0)
    p = VerifyPrice(moe_layers=4, top_k=8, num_experts=64, expert_nbytes=2 << 20, expert_rate=10e9)
    a, b, c = 0.010, 0.0004, 0.0002
    for _ in range(200):
        n = int(rng.integers(1, 10))
        u = int(4 * min(64, 8 * (1 + 0.6 * (n - 1))))
        p.observe(n, u, (a + b * n + c * u) * (1 + 0.01 * rng.standard_normal()))
    for n in (1, 3, 9):
        u = int(4 * min(64, 8 * (1 + 0.6 * (n - 1))))
        assert p.seconds(n, u) == pytest.approx(a + b * n + c * u, rel=0.05)
    fresh = VerifyPrice(1, 6, 128, 1)
    for n, ratio in UNION_PRIOR:
        assert fresh.union(n) == pytest.approx(ratio)


def test_price_fit_ignores_steps_another_program_preempted():
    """A loaded machine delays some steps by milliseconds, the longer ones (verifies) more often:
    least squares charged each position part of those delays (about +20% here); the fit's Huber
    robust weights keep the per-position cost within 5% of the steps' own, seed after seed; exact
    timings with a few delayed steps are fitted exactly."""
    a, b = 0.015, 0.0005
    for seed in range(5):
        rng = np.random.default_rng(seed)
        p = VerifyPrice(moe_layers=0, top_k=0, num_experts=0, expert_nbytes=0)
        for _ in range(256):
            n = 1 if rng.random() < 0.6 else int(rng.integers(2, 10))
            t = (a + b * n) * (1 + 0.01 * rng.standard_normal())
            if rng.random() < 0.2 * t / a:
                t += rng.uniform(0.002, 0.02)
            p.observe(n, 0, t)
        assert p.theta[1] == pytest.approx(b, rel=0.05)
        assert p.seconds(1, 0) == pytest.approx(a + b, rel=0.02)
    exact = VerifyPrice(moe_layers=0, top_k=0, num_experts=0, expert_nbytes=0)
    for i in range(64):
        n = 1 + i % 9
        exact.observe(n, 0, a + b * n + (0.01 if i % 10 == 3 else 0.0))
    assert exact.seconds(9, 0) == pytest.approx(a + 9 * b, rel=0.01)


def test_price_fit_predicts_verifies_on_the_steps_line():
    """Steps on one line a + c*experts (no per-position cost), mostly plain steps, the prior's
    per-expert cost (from the bandwidth) a third too high, as on the trace-routed replay: the
    fit is solved with every coefficient >= 0, so it predicts plain steps and verifies within
    2% (measured: 1%); the unconstrained fit pulled the per-position cost negative, and clipping
    it to 0 after the fit over-predicted plain steps by 7-10% and verifies by 11-19%."""
    a, c = 0.0037, 360e-6
    union = {1: 24, 2: 40, 3: 56, 4: 70, 5: 79, 6: 91}       # 4 layers x top 6, the replay's unions
    for seed in range(3):
        rng = np.random.default_rng(seed)
        # prior: 3 MiB experts at 6.7 GB/s, 470 us an expert
        p = VerifyPrice(moe_layers=4, top_k=6, num_experts=128, expert_nbytes=3 << 20, expert_rate=6.7e9)
        for _ in range(256):
            n = 1 if rng.random() < 0.6 else int(rng.integers(2, 7))
            p.observe(n, union[n], (a + c * union[n]) * (1 + 0.03 * rng.standard_normal()))
        assert min(p.theta) >= 0
        for n, u in union.items():
            assert p.seconds(n, u) == pytest.approx(a + c * u, rel=0.02)


def test_price_prior_charges_each_row_its_attention():
    """Only plain steps seen (the price's cold start): an extra position is priced at the decode
    attention one row took (a verify row runs the same block loops over its keys) plus 2% of the
    step, not at the 2% alone; without a measured attention (a GPU step) at 2%."""
    t1, att = 0.048, 0.0075            # the medium MoE at 4096 keys on one core: 48 ms, 7.5 in attention
    for measured, extra in ((att, att + 0.02 * t1), (0.0, 0.02 * t1)):
        p = VerifyPrice(moe_layers=0, top_k=0, num_experts=0, expert_nbytes=0)
        for _ in range(8):
            p.observe(1, 0, t1, measured)
        assert p.seconds(5, 0) - p.seconds(1, 0) == pytest.approx(4 * extra, rel=0.1)


def test_price_reads_a_position_from_steps_beside_each_other_under_drifting_load():
    """Another program's load scales every step alike for a while (here 1x and 4x in turn, in
    phases of 40 steps, with 2% one-sided delays), and verifies fall more often in the loaded
    phases: a fit over the whole window read a position at ~12x its share of a step (the 5x
    swings in the dense replay under load: 9-19% a position where steps side by side said ~2%);
    per block of steps, the shape is the steps' own and the level today's."""
    rng = np.random.default_rng(3)
    a, b = 0.025, 0.0006
    p = VerifyPrice(moe_layers=0, top_k=0, num_experts=0, expert_nbytes=0)
    for phase in range(7):
        load = (1.0, 4.0)[phase % 2]
        for _ in range(40):
            n = int(rng.integers(2, 10)) if rng.random() < (0.7 if load > 1 else 0.2) else 1
            p.observe(n, 0, load * (a + b * n) * (1 + 0.02 * abs(rng.standard_normal())))
    a_fit, b_fit, _ = p.theta
    assert b_fit / a_fit == pytest.approx(b / a, rel=0.15)
    assert p.seconds(1, 0) == pytest.approx(a + b, rel=0.05)        # the last phase ran unloaded


def test_price_learns_a_steep_row_from_its_first_verifies():
    """A machine whose extra rows cost far more than the prior says (the AVX2 Zen 1: ~35% of a
    plain step a row, the prior ~10%): four verifies of 9 rows among 200 plain steps (3%
    one-sided delays) set the price within 10% of the truth; judged from the prior's line each
    verify was many sigmas off and weighed nothing (the row stayed at ~0.10 of a step)."""
    rng = np.random.default_rng(1)
    t1, row = 0.05, 0.35
    p = VerifyPrice(moe_layers=0, top_k=0, num_experts=0, expert_nbytes=0)
    for _ in range(200):
        p.observe(1, 0, t1 * (1 + 0.03 * abs(rng.standard_normal())), 0.004)
    for _ in range(4):
        p.observe(9, 0, t1 * (1 + 8 * row) * (1 + 0.03 * abs(rng.standard_normal())), 0.036)
        for _ in range(5):
            p.observe(1, 0, t1 * (1 + 0.03 * abs(rng.standard_normal())), 0.004)
    assert (p.seconds(9, 0) / p.seconds(1, 0) - 1) / 8 == pytest.approx(row, rel=0.1)


def test_price_follows_a_verify_cost_that_is_not_a_line():
    """A dense verify's step is not a line in its rows: the first rows ride on the weights' one
    read, then each costs its multiply-adds, dearer past a tile pass (the replay's own curve,
    docs/benchmarks.md). Steps timed on that curve as often as the replay drafts each k (most
    short, 1-3 of each long one; 2% noise, 3% delayed), 12 rows never: every size is predicted
    within 10% of the curve (the sizes with 8 steps or more within 4%), where the best robust line
    is off by 10% or more at some size; and the k a draft is given (the most expected tokens less
    the run's speed x the extra seconds), over acceptance rates short to long and three speeds,
    loses under 2.5% of the true curve's best value on average (the line alone: 3.7-4.6%, seed
    after seed). The line priced short drafts dear and long ones cheap."""
    from freetoken.engine.spec.decide import best_length
    t1 = 0.017
    rel = [1, 1.07, 1.09, 1.14, 1.25, 1.33, 1.48, 1.55, 1.73, 1.9, 2.02, 2.15, 2.4, 2.55, 2.7, 2.82, 2.96]
    curve = {k + 1: t1 * r for k, r in enumerate(rel)}
    sizes = [n for n in curve if n != 12]
    often = np.array([35, 25, 10, 8, 5, 4, 2, 2.5, 1, 1, 1, 1, .5, .5, 1, .5])
    for seed in range(3):
        rng = np.random.default_rng(seed)
        p = VerifyPrice(moe_layers=0, top_k=0, num_experts=0, expert_nbytes=0)
        seen = {}
        for _ in range(256):
            n = int(rng.choice(sizes, p=often / often.sum()))
            seen[n] = seen.get(n, 0) + 1
            t = curve[n] * (1 + 0.02 * rng.standard_normal())
            p.observe(n, 0, t + (rng.uniform(0.2, 1.0) * t1 if rng.random() < 0.03 else 0.0))
        for n in curve:
            assert p.seconds(n, 0) == pytest.approx(curve[n], rel=0.04 if seen.get(n, 0) >= 8 else 0.1), n
        line = p.theta
        assert max(abs((line[0] + line[1] * n) / curve[n] - 1) for n in sizes) > 0.1
        losses = []
        for first, nxt in ((0.3, 0.7), (0.5, 0.8), (0.7, 0.9), (0.9, 0.97), (0.95, 0.99)):
            exp, run = [0.0], 1.0
            for i in range(16):
                run *= first if i == 0 else nxt
                exp.append(exp[-1] + run)
            for speed in (1.3, 1.6, 1.9):
                def value(k):
                    return exp[k] - speed / t1 * (curve[1 + k] - curve[1])
                best = max(value(k) for k in range(17))
                k = best_length(exp, [0.0] + [p.seconds(1 + j, 0) - p.seconds(1, 0) for j in range(1, 17)],
                                speed / t1)[0]
                losses.append((best - value(k)) / best)
        assert np.mean(losses) < 0.025, seed           # the line alone: 0.037-0.046


def test_price_median_is_numpys():
    """The fit's own median (one sort: np.median cost 70% of a fit) gives numpy's values
    exactly, odd and even lengths, 1-D and per row."""
    from freetoken.engine.spec.price import _median
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 4, 15, 16, 17, 256):
        a = rng.standard_normal(n) * 1e-2
        assert float(_median(a)) == float(np.median(a))
        a = np.round(a, 3)                   # ties
        assert float(_median(a)) == float(np.median(a))
    rows = rng.random((7, 16))
    assert np.array_equal(_median(rows), np.median(rows, axis=1))


def test_price_fits_only_when_a_draft_is_priced(monkeypatch):
    """Steps that draft nothing (random text) only record their timing: the robust fit (0.5-1 ms)
    runs when the price is read, again only once an eighth of the window is new, and what it
    reads then is exactly the steps' own line (a + b * positions)."""
    a, b = 0.015, 0.0005
    p = VerifyPrice(moe_layers=0, top_k=0, num_experts=0, expert_nbytes=0)
    fits = []
    fit = p._fit
    monkeypatch.setattr(p, "_fit", lambda: (fits.append(len(p.samples)), fit()))
    for i in range(200):
        p.observe(1 + i % 5, 0, a + b * (1 + i % 5))
    assert fits == [] and p.ready
    assert p.seconds(7, 0) == pytest.approx(a + 7 * b, rel=5e-3)    # the load levels: ~0.2% off
    p.seconds(3, 0)
    assert fits == [200]
    for i in range(24):                      # 224 samples: a refit after 28 new ones
        p.observe(1, 0, a + b)
    p.seconds(1, 0)
    assert fits == [200]
    for i in range(4):
        p.observe(1, 0, a + b)
    p.seconds(1, 0)
    assert fits == [200, 228]


def test_speculative_options_are_checked_in_one_line():
    from freetoken.config import EngineConfig
    from freetoken.errors import InvalidRequestError
    with pytest.raises(InvalidRequestError, match="speculative: draft needs --draft-model") as e:
        EngineConfig(model="m", speculative="draft")
    assert "\n" not in str(e.value)
    with pytest.raises(InvalidRequestError, match="draft_model: only used with"):
        EngineConfig(model="m", speculative="suffix", draft_model="d")
    with pytest.raises(InvalidRequestError, match="spec_max_draft"):
        EngineConfig(model="m", spec_max_draft=0)


def test_routing_observer_counts_each_steps_distinct_experts(tiny_dir):
    """The price learns from the distinct (layer, expert) pairs of each step: counted per layer
    call (a set for a decode step's few ids, torch.unique for a prefill's), equal to the pairs
    the layers were handed, for one-token steps and verifies of drafts."""
    from freetoken import LLM, SamplingParams
    llm = LLM(str(tiny_dir("qwen3_moe")), dtype="float32")
    spec = llm.engine.spec
    seen, counted = [], []
    for m in spec.observer.layers:
        prev = m.on_route

        def on_route(layer, ids, w, prev=prev):
            seen.append((layer, ids.clone()))
            prev(layer, ids, w)
        m.on_route = on_route
    end = spec.end_forward

    def end_forward():
        pairs = {(layer, int(e)) for layer, ids in seen for e in ids.reshape(-1).tolist()}
        counted.append((spec.observer.unique, len(pairs), spec._step_positions))
        seen.clear()
        end()
    spec.end_forward = end_forward
    spec.priced = False                      # every proposal drafted: verifies of several positions
    llm.generate([[5, 6, 7, 8] * 6], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    assert counted and all(u == n for u, n, _ in counted)
    assert any(p > 1 for _, _, p in counted[1:])
