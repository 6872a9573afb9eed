"""Sampling checked by distributions and seeds, and penalties against their definitions."""
from __future__ import annotations

import pytest
import torch

from freetoken import SamplingParams
from freetoken.engine.sampler import apply_penalties, sample_one
from freetoken.engine.sequence import Sequence
from freetoken.errors import InvalidRequestError


def _seq(seed=0, prompt=(1, 2, 3), **kw):
    return Sequence("s", list(prompt), SamplingParams(seed=seed, **kw), None, 0)


def _freqs(logits, n=4000, **kw):
    seq = _seq(**kw)
    counts = torch.zeros(logits.shape[0])
    for _ in range(n):
        counts[sample_one(logits.clone(), seq)] += 1
    return counts / n


LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def test_temperature_sampling_follows_softmax():
    for t in (0.5, 1.0, 2.0):
        f = _freqs(LOGITS, temperature=t)
        p = torch.softmax(LOGITS / t, 0)
        assert (f - p).abs().max() < 0.03, (t, f, p)


def test_top_k_restricts_support_and_renormalises():
    f = _freqs(LOGITS, top_k=2)
    assert f[2:].sum() == 0
    p = torch.softmax(LOGITS[:2], 0)
    assert (f[:2] - p).abs().max() < 0.03


def test_top_p_keeps_smallest_prefix_reaching_p():
    p = torch.softmax(LOGITS, 0)              # ~[.57, .21, .13, .08, ...]
    f = _freqs(LOGITS, top_p=0.8)
    assert f[3:].sum() == 0 and f[2] > 0      # .57+.21 < .8 so the third token stays in
    assert (f[:3] - p[:3] / p[:3].sum()).abs().max() < 0.03


def test_min_p_drops_tokens_below_fraction_of_max():
    p = torch.softmax(LOGITS, 0)
    f = _freqs(LOGITS, min_p=0.3)
    keep = p >= 0.3 * p.max()
    assert f[~keep].sum() == 0 and (f[keep] > 0).all()


def test_greedy_is_argmax():
    assert sample_one(LOGITS.clone(), _seq(temperature=0.0)) == 0


def test_same_seed_same_tokens_different_seed_differs():
    logits = torch.zeros(50)
    a = [sample_one(logits.clone(), s) for s in [_seq(seed=7)] for _ in range(20)]
    s1, s2, s3 = _seq(seed=7), _seq(seed=7), _seq(seed=8)
    a = [sample_one(logits.clone(), s1) for _ in range(20)]
    b = [sample_one(logits.clone(), s2) for _ in range(20)]
    c = [sample_one(logits.clone(), s3) for _ in range(20)]
    assert a == b and a != c


def test_penalties_match_their_definitions():
    seq = _seq(prompt=(0, 1), repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    seq.append(1)
    seq.append(1)
    seq.append(4)
    logits = torch.tensor([1.0, 2.0, 3.0, -1.0, -2.0, 0.5])
    out = apply_penalties(logits.clone(), seq)
    expected = logits.clone()
    for t in {0, 1, 4}:                                     # HF repetition penalty over prompt + output
        expected[t] = expected[t] / 2.0 if expected[t] > 0 else expected[t] * 2.0
    expected[1] -= 0.25 * 2 + 0.5                           # OpenAI frequency + presence over the output
    expected[4] -= 0.25 * 1 + 0.5
    assert torch.allclose(out, expected)


@pytest.mark.parametrize("field,value", [("temperature", -1.0), ("top_p", 0.0), ("top_k", -1), ("max_tokens", 0),
                                         ("min_p", 1.5), ("repetition_penalty", 0.0), ("presence_penalty", 3.0)])
def test_invalid_params_raise_typed_error(field, value):
    with pytest.raises(InvalidRequestError, match=field):
        SamplingParams(**{field: value})
