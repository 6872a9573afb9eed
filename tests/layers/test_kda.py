"""KDA (Kimi delta attention) rules against transformers' torch reference (GLM-5.3-Flash):
chunked and recurrent forms, resuming from a state anywhere, per-channel gates that decay fast."""
from __future__ import annotations

import pytest
import torch
from transformers.models.glm5_next import modeling_glm5_next as ref

from freetoken.layers.kda import chunk_kda, recurrent_kda


def inputs(b=2, t=77, h=3, d=16, seed=0, lower=-5.0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, t, h, d, generator=g) for _ in range(3))
    gate = lower * torch.sigmoid(torch.randn(b, t, h, d, generator=g))
    beta = torch.sigmoid(torch.randn(b, t, h, generator=g))
    state = torch.randn(b, h, d, d, generator=g) * 0.1
    return q, k, v, gate, beta, state


def reference(q, k, v, g, beta, state):
    return ref.chunk_kimi_delta_attention(q, k, v, g, beta, initial_state=state, output_final_state=True,
                                          use_qk_l2norm_in_kernel=True)


@pytest.mark.parametrize("t", [1, 5, 32, 77, 150])
@pytest.mark.parametrize("rule", [chunk_kda, recurrent_kda])
def test_matches_transformers(rule, t):
    q, k, v, g, beta, s = inputs(t=t)
    want, want_state = reference(q, k, v, g, beta, s)
    got, got_state = rule(q, k, v, g, beta, s)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(got_state, want_state, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("cut", [1, 31, 40])
def test_resume_from_state_anywhere(cut):
    q, k, v, g, beta, s = inputs()
    whole, whole_state = chunk_kda(q, k, v, g, beta, s)
    a, sa = chunk_kda(q[:, :cut], k[:, :cut], v[:, :cut], g[:, :cut], beta[:, :cut], s)
    b, sb = recurrent_kda(q[:, cut:cut + 1], k[:, cut:cut + 1], v[:, cut:cut + 1], g[:, cut:cut + 1],
                          beta[:, cut:cut + 1], sa)
    c, sc = chunk_kda(q[:, cut + 1:], k[:, cut + 1:], v[:, cut + 1:], g[:, cut + 1:], beta[:, cut + 1:], sb)
    torch.testing.assert_close(torch.cat([a, b, c], dim=1), whole, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(sc, whole_state, atol=2e-6, rtol=1e-5)


def test_fast_decay_stays_finite():
    """Gates near -60 per token: cumulative decays far below fp32's range inside one chunk."""
    q, k, v, g, beta, s = inputs(lower=-60.0)
    got, state = chunk_kda(q, k, v, g, beta, s)
    want, _ = recurrent_kda(q, k, v, g, beta, s)
    assert torch.isfinite(got).all() and torch.isfinite(state).all()
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


def test_input_state_is_not_modified():
    q, k, v, g, beta, s = inputs(t=3)
    keep = s.clone()
    recurrent_kda(q, k, v, g, beta, s)
    chunk_kda(q, k, v, g, beta, s)
    assert torch.equal(s, keep)
