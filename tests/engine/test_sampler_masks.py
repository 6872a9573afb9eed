"""A token a logits processor masks (a grammar's -inf) is never sampled, whatever the logits
and the sampling settings: the inverse-CDF draw, top-k, top-p, min-p, penalties and the
fall-back to the argmax all keep to the allowed set (issue 36: constrained output must never
end short because a masked token slipped through)."""
from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

from freetoken import SamplingParams
from freetoken.engine.sampler import draw, sample_one
from freetoken.engine.sequence import Sequence

LOGIT = st.one_of(st.floats(-1e4, 1e4, width=32), st.sampled_from([0.0, -1e30, 1e30, 3.4e38, -3.4e38]))


@st.composite
def masked_rows(draw_):
    v = draw_(st.integers(2, 40))
    logits = draw_(st.lists(LOGIT, min_size=v, max_size=v))
    allowed = draw_(st.lists(st.booleans(), min_size=v, max_size=v).filter(any))
    return torch.tensor(logits, dtype=torch.float32), torch.tensor(allowed)


SETTINGS = st.fixed_dictionaries({}, optional={
    "temperature": st.sampled_from([0.0, 1e-3, 0.3, 0.7, 1.0, 1.5, 100.0]),
    "top_k": st.integers(0, 50), "top_p": st.sampled_from([1e-9, 0.1, 0.5, 0.95, 1.0]),
    "min_p": st.sampled_from([0.0, 0.05, 0.5, 1.0]),
    "repetition_penalty": st.sampled_from([1.0, 0.5, 2.0]),
    "presence_penalty": st.sampled_from([0.0, -2.0, 2.0])})


@settings(max_examples=400, deadline=None)
@given(masked_rows(), SETTINGS, st.integers(0, 2**32))
def test_a_masked_token_is_never_sampled(row, kw, seed):
    logits, allowed = row

    def grammar(output_ids, x):                # what server/grammar.py's processor does
        return x.masked_fill(~allowed, float("-inf"))
    params = SamplingParams(seed=seed, logits_processors=[grammar], **kw)
    seq = Sequence("s", [0, 1], params, None, 0)
    seq.output_ids.extend([1, 1, 0])          # penalties see earlier output
    for _ in range(3):
        tok = sample_one(logits.clone(), seq)
        assert allowed[tok], (tok, allowed.tolist(), logits.tolist(), kw)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([0.0, 1e-45, 1e-30, 1e-8, 0.3, 1.0, 3e38]), min_size=1, max_size=30)
       .filter(lambda p: any(p)), st.integers(0, 2**32))
def test_draw_picks_only_tokens_of_positive_probability(probs, seed):
    g = torch.Generator().manual_seed(seed)
    p = torch.tensor(probs, dtype=torch.float32)
    for _ in range(20):
        assert p[draw(p, g)] > 0


def test_draw_at_the_ends_of_the_unit_interval(monkeypatch):
    """u = 0 and u just under 1 (u * total rounds up to the total) both land on allowed tokens."""
    p = torch.tensor([0.0, 0.0, 0.25, 0.0, 0.75, 0.0, 0.0])
    for u, want in ((0.0, 2), (1.0 - 2.0 ** -53, 4)):
        monkeypatch.setattr(torch, "rand", lambda *a, u=u, **k: torch.tensor(u, dtype=torch.float64))
        assert draw(p, torch.Generator()) == want
