"""A GGUF MoE whose experts are llama.cpp block types, prefilled through the ggml experts' tiles
(kernels/c/ggml_tiles.c: weight rows decoded once per call into bf16, then the bf16 tiles): a
prompt long enough for the call threshold (kernels/gemm.EXPERT_MIN_TOKENS) with every expert past
the per-expert one, logits against the F32 GGUF of the same dequantized weights (gguf.quants)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from freetoken import LLM
from freetoken.kernels import load
from freetoken.kernels.gemm import EXPERT_MIN_TOKENS, modes_here
from freetoken.quant import ggml_iquants as iq
from freetoken.quant import ggml_quants as gq
from test_gguf_iquants import f32_gguf, write_iq  # noqa: F401  (the module's fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from model_checks import ids_for  # noqa: E402

MODES = [m for m in ("amx", "vdpbf16ps") if m in modes_here(load("native"))] or ["vdpbf16ps"]


def experts_only(t):
    return lambda name, shape: t if "_exps." in name else None


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("t", [iq.IQ2_XXS, iq.IQ3_XXS], ids=gq.type_name)
def test_prefill_through_ggml_tiles_matches_float_reference(f32_gguf, tmp_path, t, mode):  # noqa: F811
    q, ref = tmp_path / "q.gguf", tmp_path / "ref.gguf"
    write_iq(f32_gguf, q, ref, experts_only(t), seed=t)
    ids = ids_for(EXPERT_MIN_TOKENS + 34, seed=5)      # 4 experts: every one far past the per-expert threshold
    ref_llm = LLM(str(ref), dtype="float32")
    want = ref_llm.score(ids)
    ref_llm.close()
    out = {}
    for numerics in ("auto", "q8"):                    # q8: the int8 dots, the tiles switched off
        llm = LLM(str(q), dtype="float32", prefill_gemm=mode, ggml_numerics=numerics)
        out[numerics] = llm.score(ids)
        llm.close()
    assert not torch.equal(out["auto"], out["q8"])    # the prefill took another path
    got, scale = out["auto"], max(1.0, want.abs().max().item())
    per_pos = (got - want).abs().amax(-1) / scale
    # bf16 weights and activations: within the tolerance of tests/weights/test_gguf_iquants.py's
    # packed check (whose int8 dots flip a router near-tie here at one of 100 positions: 0.33)
    assert per_pos.median().item() <= 3e-2 and per_pos.max().item() <= 0.25, per_pos
    assert (got.argmax(-1) == want.argmax(-1)).float().mean().item() >= 0.9
