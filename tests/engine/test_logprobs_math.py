"""engine/logprobs.py against float64 log-softmax written out: the chosen token's logprob,
the top-k in order (ties: the smaller id first), the prompt's rows shifted by one."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from freetoken.engine.logprobs import prompt_logprobs, rows_logprobs, token_logprobs
from freetoken.errors import InvalidRequestError
from freetoken.sampling_params import MAX_TOP_LOGPROBS, SamplingParams


def ref_row(row):
    x = [float(v) for v in row]
    m = max(x)
    z = m + math.log(sum(math.exp(v - m) for v in x))
    return [v - z for v in x]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-30, 30), min_size=2, max_size=40), st.integers(0, 8), st.data())
def test_token_logprobs_match_float64(vals, k, data):
    row = torch.tensor(vals, dtype=torch.float32)
    tid = data.draw(st.integers(0, len(vals) - 1))
    got = token_logprobs(row, tid, k)
    ref = ref_row(row.tolist())
    assert got.logprob == pytest.approx(ref[tid], abs=1e-5)
    order = sorted(range(len(ref)), key=lambda i: (-row[i].item(), i))[:k]
    assert [t for t, _ in got.top] == order
    assert [v for _, v in got.top] == pytest.approx([ref[i] for i in order], abs=1e-5)


def test_prompt_rows_predict_the_next_token_and_first_is_none():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 50, generator=g)
    ids = [3, 9, 1, 49, 0, 7, 7]
    out = prompt_logprobs(logits, ids, 2, chunk=3)       # chunks smaller than the prompt
    assert out[0] is None and len(out) == len(ids)
    for j in range(1, len(ids)):
        assert out[j].token_id == ids[j]
        assert out[j].logprob == pytest.approx(ref_row(logits[j - 1].tolist())[ids[j]], abs=1e-5)


def test_minus_inf_logits_stay_minus_inf_and_nan_is_minus_inf():
    row = torch.tensor([0.0, float("-inf"), float("nan"), 1.0])
    got = rows_logprobs(row.reshape(1, -1).expand(2, -1), [1, 3], 4)
    assert got[0].logprob == float("-inf")
    assert got[1].logprob == pytest.approx(1 - math.log(1 + math.e), abs=1e-6)


@pytest.mark.parametrize("bad", [-1, MAX_TOP_LOGPROBS + 1, 2.5, True])
def test_sampling_params_bound_logprobs(bad):
    with pytest.raises(InvalidRequestError, match="logprobs"):
        SamplingParams(logprobs=bad)
