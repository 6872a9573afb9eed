"""Qwen3.5 / Qwen3.6 MoE against transformers, including the text part of a
Qwen3_5MoeForConditionalGeneration checkpoint with vision and MTP weights beside it."""
from __future__ import annotations

import json
import shutil

import torch
import transformers
from safetensors.torch import load_file, save_file

from helpers import assert_logits_close, reference_logits
from model_checks import (
    check_batch_equals_single,
    check_prefix_cache_exact,
    check_incremental_equals_full,
    check_snapshot_restore_equals_recompute,
    ids_for,
)
from freetoken import LLM


def tiny(tiny_dir, **kw):
    """make-tiny's qwen3_5_moe, with weights large enough that a wrong recurrent state shows in the logits."""
    return tiny_dir("qwen3_5_moe", initializer_range=0.2, **kw)


def test_logits_match_transformers(tiny_dir):
    d = tiny(tiny_dir, layers=4)
    ids = ids_for(70)
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), reference_logits(d, ids))


def test_conditional_generation_checkpoint_text_part(tiny_dir, tmp_path):
    text = json.loads((tiny(tiny_dir) / "config.json").read_text())
    for k in ("architectures", "model_type", "transformers_version", "dtype"):
        text.pop(k, None)
    text["rope_parameters"]["mrope_section"] = [2, 1, 1]
    text["rope_parameters"]["mrope_interleaved"] = True
    config = transformers.Qwen3_5MoeConfig(text_config=text, vision_config=dict(
        depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=64, patch_size=2,
        temporal_patch_size=1, spatial_merge_size=1))
    torch.manual_seed(0)
    model = transformers.Qwen3_5MoeForConditionalGeneration(config).eval()
    d = tmp_path / "q35vl"
    model.save_pretrained(d)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny(tiny_dir) / f, d / f)
    tensors = load_file(str(d / "model.safetensors"))     # add an MTP head, as released checkpoints have
    tensors["mtp.fc.weight"] = torch.randn(64, 128)
    tensors["mtp.layers.0.input_layernorm.weight"] = torch.randn(64)
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    ids = ids_for(30)
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([ids])).logits[0]
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), ref)


def test_incremental_decode_equals_full_forward(tiny_dir):
    check_incremental_equals_full(tiny(tiny_dir))


def test_batch_equals_single(tiny_dir):
    check_batch_equals_single(tiny(tiny_dir))


def test_snapshot_restore_equals_recompute(tiny_dir):
    check_snapshot_restore_equals_recompute(tiny(tiny_dir, layers=4))


def test_prefix_cache_serves_the_same_logits(tiny_dir):
    check_prefix_cache_exact(tiny(tiny_dir))
