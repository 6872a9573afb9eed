"""`expert_format` re-encodes a float checkpoint's experts at load; every backend runs it."""
from __future__ import annotations

import pytest

from freetoken import LLM
from freetoken.errors import InvalidRequestError


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("fmt,tol", [("int8", 0.03), ("fp8", 0.1), ("mxfp4", 0.3), ("nvfp4", 0.3), ("ggml", 0.03)])
def test_requantized_experts_stay_close_and_backends_agree(tiny_dir, fmt, tol):
    d = str(tiny_dir("qwen3_moe", hidden=64))
    ids = list(range(5, 40))
    ref = LLM(d, dtype="float32", moe_backend="resident").score(ids)
    resident = LLM(d, dtype="float32", moe_backend="resident", expert_format=fmt)
    assert resident.engine.model.pool.spec.fmt == fmt
    q_res = resident.score(ids)
    assert _rel(q_res, ref) < tol                         # quantization error only
    q_cpu = LLM(d, dtype="float32", moe_backend="cpu", expert_format=fmt).score(ids)
    assert _rel(q_cpu, q_res) < 0.02                      # the CPU kernels round activations to int8


def test_unknown_expert_format_is_a_clear_error(tiny_dir):
    with pytest.raises(InvalidRequestError, match="expert_format"):
        LLM(str(tiny_dir("qwen3_moe")), dtype="float32", expert_format="q4_k")
