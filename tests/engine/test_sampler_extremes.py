"""Extreme but accepted sampling values never make the sampler raise (one request's numbers
must not fail the whole batch); NaN logits from a broken model are one typed error."""
from __future__ import annotations

import math

import pytest
import torch

from freetoken import SamplingParams, kernels
from freetoken.engine.sampler import sample, sample_one
from freetoken.engine.sequence import Sequence
from freetoken.errors import InvalidRequestError, NumericalError
from freetoken.sampling_params import MIN_TEMPERATURE


def _seq(**kw):
    return Sequence("s", [1, 2, 3], SamplingParams(seed=0, **kw), None, 0)


LOGITS = torch.tensor([30.0, 29.0, -5.0, 0.0, 12.0, -80.0])


@pytest.mark.parametrize("kw", [dict(temperature=1e-300), dict(temperature=1e-44), dict(temperature=5e-3),
                                dict(temperature=100.0, top_p=1e-9), dict(temperature=1e-5, min_p=1.0),
                                dict(repetition_penalty=0.01, temperature=1e-4),
                                dict(repetition_penalty=10.0, frequency_penalty=2.0, presence_penalty=-2.0)])
def test_extreme_values_sample_a_valid_token(kw):
    p = SamplingParams(**kw)
    assert p.temperature == 0.0 or p.temperature >= MIN_TEMPERATURE
    for logits in (LOGITS, LOGITS * 1e30, torch.tensor([float("inf"), 1.0, float("-inf"), 0.0, 2.0, 3.0])):
        tok = sample_one(logits.clone(), _seq(**kw))
        assert 0 <= tok < logits.numel()


def test_tiny_temperature_is_argmax():
    # a temperature this small is greedy in effect: the winner must be the argmax
    assert all(sample_one(LOGITS.clone(), _seq(temperature=1e-300)) == 0 for _ in range(20))


def test_partial_nan_is_ignored_and_all_nan_raises():
    logits = LOGITS.clone()
    logits[0] = float("nan")
    assert sample(logits[None].clone(), [_seq(temperature=0.0)]) == [1]
    assert sample_one(logits.clone(), _seq(temperature=0.5)) != 0
    with pytest.raises(NumericalError, match="NaN"):
        sample(torch.full((2, 6), float("nan")), [_seq(temperature=0.0), _seq(temperature=0.0)])


@pytest.mark.parametrize("field,value", [("temperature", math.inf), ("temperature", math.nan),
                                         ("top_p", math.nan), ("repetition_penalty", 1e-300),
                                         ("presence_penalty", -math.inf), ("seed", 2**64),
                                         ("seed", "7"), ("top_k", 2.5), ("max_tokens", True)])
def test_out_of_range_rejected_at_construction(field, value):
    with pytest.raises(InvalidRequestError, match=field):
        SamplingParams(**{field: value})


def test_greedy_rows_take_the_first_maximum_and_skip_nan():
    """Greedy rows (the CPU float32 rows' numpy argmax, sampler.greedy_tokens) against a plain
    Python scan: the first of tied maxima, infinities, NaN never chosen, a strided view."""
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(-3, 4, (6, 40), generator=g).float()     # many ties
    rows[1, 5] = rows[1, 30] = float("inf")
    rows[2] = float("-inf")
    rows[2, 17] = rows[2, 20] = -1.0
    rows[3, [0, 9]] = float("nan")
    rows[4, rows[4].argmax()] = float("nan")
    wide = torch.zeros(6, 80)
    wide[:, ::2] = rows

    def first_max(row):
        vals = [v for v in row.tolist() if not math.isnan(v)]
        return row.tolist().index(max(vals))
    want = [first_max(r) for r in rows]
    seqs = [_seq(temperature=0.0) for _ in range(6)]
    assert sample(rows.clone(), seqs) == want
    assert sample(wide[:, ::2], seqs) == want


@pytest.mark.parametrize("isa", kernels.variants_here())
def test_c_argmax_is_the_first_maximum_on_every_build(isa):
    """`ft_argmax` (greedy_tokens' contiguous rows) against torch on each kernel build: the first
    of tied maxima, infinities, -0.0 against 0.0, a row of -inf, lengths off the vector width;
    -1 for a row holding a NaN anywhere (the caller masks it)."""
    lib = kernels.load(isa)
    g = torch.Generator().manual_seed(1)
    rows = [torch.randn(n, generator=g) for n in (1, 7, 16, 33, 8192)]
    rows += [torch.randint(-3, 4, (40,), generator=g).float(), torch.full((9,), float("-inf")),
             torch.tensor([-0.0, 0.0, -1.0]), torch.tensor([0.0, -0.0]), torch.tensor([1.0, float("inf"), float("inf")])]
    for row in rows:
        want = row.tolist().index(max(row.tolist()))      # the first index that compares equal to the max
        assert lib.ft_argmax(row.data_ptr(), row.numel()) == want
    for at in (0, 5, 39):
        row = torch.randn(40, generator=g)
        row[at] = float("nan")
        assert lib.ft_argmax(row.data_ptr(), 40) == -1
