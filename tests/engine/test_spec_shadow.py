"""Proposals the price did not draft are scored against what the sequence then emitted
(spec/shadow.py): each is scored once, when its outcome is known, with the accepted length a
brute-force prefix match gives; a price that rejects every draft still learns, and output
stays plain's."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken import LLM
from freetoken.engine.spec.acceptance import AcceptanceStats
from freetoken.engine.spec.drafters import NUM_BUCKETS, Draft
from freetoken.engine.spec.shadow import ShadowScores
from test_speculative import GREEDY, generate, ids_for


class Recorder:
    def __init__(self):
        self.calls = []

    def observe_shadow(self, drafter, bucket, drafted, accepted):
        self.calls.append((drafter, bucket, drafted, accepted))


def brute_outcome(draft, stream, n0):
    """(accepted, known) of a draft made at n0, with the whole stream emitted."""
    for i, d in enumerate(draft):
        if n0 + i >= len(stream):
            return i, False
        if stream[n0 + i] != d:
            return i, True
    return len(draft), True


@settings(max_examples=150, deadline=None)
@given(stream=st.lists(st.integers(0, 2), min_size=1, max_size=40),
       props=st.lists(st.tuples(st.integers(0, 39), st.lists(st.integers(0, 2), min_size=1, max_size=6)),
                      max_size=12),
       cuts=st.lists(st.integers(0, 40), max_size=6))
def test_each_proposal_is_scored_once_with_its_prefix_match(stream, props, cuts):
    rec = Recorder()
    sh = ShadowScores(rec, max_pending=100)
    want = []
    for j, (n0, toks) in enumerate(sorted(props)):
        n0 = min(n0, len(stream))
        sh.keep("s", Draft(tuple(toks), "d", j), n0)
        acc, known = brute_outcome(toks, stream, n0)
        if known:
            want.append(("d", j, len(toks), acc))
    # the sequence grows in steps (a verify emits several tokens at once); settle at each
    for cut in sorted(c for c in cuts if c < len(stream)) + [len(stream)]:
        sh.settle("s", stream[:cut])
    sh.settle("s", stream)
    assert sorted(rec.calls) == sorted(want)
    sh.forget("s")
    sh.settle("s", stream + [0] * 10)
    assert sorted(rec.calls) == sorted(want)        # a forgotten sequence's open proposals are dropped


def test_shadow_evidence_moves_rates_but_not_the_drafter_counts():
    stats = AcceptanceStats(4)
    for _ in range(200):
        stats.observe_shadow("suffix", 3, 4, 4)
    assert stats.expected_accepted("suffix", 3, 4)[-1] > 3.5
    assert stats.summary() == {}


def test_a_price_that_drafts_nothing_still_learns_and_output_is_plain(tiny_dir):
    path = tiny_dir("qwen3_moe")
    prompts = [ids_for(12, 1) * 3, ids_for(10, 2) * 3]
    plain = generate(LLM(str(path), dtype="float32", speculative="off"), prompts, GREEDY)
    llm = LLM(str(path), dtype="float32")
    spec = llm.engine.spec
    for _ in range(60):                              # each drafted position costs 1.5 plain steps
        for n in (1, 2, 3, 5, 9):
            spec.price.observe(n, min(16, 4 * n), 0.010 + 0.015 * (n - 1))
    spec.price.observe = lambda *a: None             # hold that price (the tiny model's own steps are cheap)
    assert generate(llm, prompts, GREEDY) == plain
    assert spec.stats.summary() == {}                # nothing was drafted ...
    prior = AcceptanceStats(spec.K).rates("none", 0)
    learned = [spec.stats.rates(d, b) != prior for d in ("suffix", "ngram") for b in range(3 * NUM_BUCKETS)]  # alone, disagreeing, agreeing
    assert any(learned)                              # ... yet the proposals were scored
