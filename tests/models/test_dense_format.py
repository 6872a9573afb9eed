"""`dense_format="int8"`: attention / lm_head weights stored as int8 + fp16 scale per 32,
checked against transformers running the same int8-rounded weights."""
from __future__ import annotations

import pytest
import torch

from helpers import assert_logits_close
from freetoken import LLM
from freetoken.errors import InvalidRequestError
from freetoken.layers.kernel_rows import GEMV_TOKENS
from freetoken.quant.int8 import dequantize_int8, quantize_int8

DENSE = ("q_proj", "k_proj", "v_proj", "o_proj", "lm_head")


def _reference_with_int8_dense(model_dir, ids):
    import transformers
    ref = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        for name, mod in ref.named_modules():
            if isinstance(mod, torch.nn.Linear) and name.rsplit(".", 1)[-1] in DENSE:
                mod.weight.copy_(dequantize_int8(*quantize_int8(mod.weight)))
        return ref(torch.tensor([ids])).logits[0].float()


def test_int8_dense_matches_transformers_on_the_same_rounded_weights(tiny_dir):
    d = tiny_dir("qwen3_moe", hidden=64)
    ids = [(7 * i) % 500 for i in range(GEMV_TOKENS + 20)]     # a prefill chunk: dequantize + fp32 GEMM
    llm = LLM(str(d), dtype="float32", dense_format="int8")
    assert llm.engine.model.layers[0].attn.qkv.weight.dtype == torch.int8
    ref = _reference_with_int8_dense(d, ids)
    assert_logits_close(llm.score(ids), ref)
    # decode-sized inputs: the GEMV quantizes activations to int8 per 32, as llama.cpp's Q8_0 does
    assert_logits_close(llm.score(ids[:9]), ref[:9], rel=3e-2)


def test_unknown_dense_format_is_a_clear_error(tiny_dir):
    with pytest.raises(InvalidRequestError, match="dense_format"):
        LLM(str(tiny_dir("qwen3_moe")), dtype="float32", dense_format="q4_k")
