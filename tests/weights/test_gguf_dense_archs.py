"""Dense decoders (GGUF `llama` without experts, `qwen2`, `qwen3`, `gemma3`) made by llama.cpp's
own converter from tiny transformers checkpoints give the checkpoint's logits: f32 exactly,
q8_0 as test_gguf_models.check_quantized bounds it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from freetoken import LLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from helpers import assert_logits_close, reference_logits  # noqa: E402
from model_checks import ids_for  # noqa: E402
from test_gguf_models import check_quantized  # noqa: E402

# Gemma 3 slides five layers in six: six layers have both kinds
TINY = {"gemma3": dict(layers=6)}
DENSE = ["llama", "qwen2", "qwen3", "gemma3"]


@pytest.mark.parametrize("arch", DENSE)
def test_f32_gguf_matches_checkpoint(tiny_dir, to_gguf, arch):
    d = tiny_dir(arch, **TINY.get(arch, {}))
    ids = ids_for(37)
    llm = LLM(str(to_gguf(d, "f32")), dtype="float32")
    assert llm.engine.model.experts is None
    assert_logits_close(llm.score(ids), reference_logits(d, ids))


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_q8_0_gguf_matches_rounded_checkpoint(tiny_dir, to_gguf, tmp_path, arch):
    d = tiny_dir(arch, **TINY.get(arch, {}))
    check_quantized(d, to_gguf(d, "q8_0"), tmp_path / "ref", ids_for(29, seed=4))
