"""DeepSeek-V2 GGUFs (deepseek2 with a softmax router: the converter writes no gating key, so
llama.cpp's default, softmax, applies) give transformers' DeepseekV2ForCausalLM logits: V2-Lite's
plain top-k and V2's group-limited greedy choice with a routed scaling factor."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from helpers import assert_logits_close, reference_logits, save_hf_checkpoint, top2_margin

from freetoken import LLM
from freetoken.layers.moe import grouped_sigmoid_topk
from freetoken.weights.gguf.reader import GgufFile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from model_checks import ids_for  # noqa: E402

V2 = {"v2_lite": dict(topk_method="greedy", q_lora_rank=None, routed_scaling_factor=1.0),
      "v2": dict(topk_method="group_limited_greedy", n_group=4, topk_group=2, q_lora_rank=32,
                 routed_scaling_factor=2.5)}


def v2_checkpoint(out: Path, tokenizer_from: Path, kind: str) -> Path:
    import transformers
    eos = json.loads((tokenizer_from / "config.json").read_text()).get("eos_token_id")
    cfg = transformers.DeepseekV2Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
        first_k_dense_replace=1, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=None, eos_token_id=eos, **V2[kind])
    return save_hf_checkpoint(cfg, out, tokenizer_from, seed=5)


@pytest.mark.parametrize("kind", sorted(V2))
def test_softmax_deepseek2_gguf_matches_transformers(tiny_dir, to_gguf, tmp_path, kind):
    d = v2_checkpoint(tmp_path / kind, tiny_dir("deepseek_v3"), kind)
    g = to_gguf(d, "f32")
    ck = GgufFile(g)
    assert ck.config["scoring_func"] == "softmax" and ck.config["norm_topk_prob"] is False
    assert ck.config["n_group"] == V2[kind].get("n_group", 1)
    ids = ids_for(31, seed=2)
    ref = reference_logits(d, ids)
    assert top2_margin(ref).min() > 1e-3          # no argmax near-tie hides a routing difference
    assert_logits_close(LLM(str(g), dtype="float32").score(ids), ref)


def test_softmax_group_limited_greedy_matches_the_definition():
    """Groups ranked by their best softmax score, top-k inside the kept groups, no renormalisation."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 16, generator=g)
    ids, w = grouped_sigmoid_topk(logits, torch.zeros(16), 3, 4, 2, False, 2.5, score="softmax")
    scores = logits.softmax(-1)
    best = scores.view(64, 4, 4).amax(-1).topk(2, dim=-1).indices
    for row in range(64):
        allowed = torch.cat([torch.arange(4 * int(k), 4 * int(k) + 4) for k in best[row]])
        top = allowed[scores[row, allowed].topk(3).indices]
        assert sorted(ids[row].tolist()) == sorted(top.tolist())
        torch.testing.assert_close(w[row], scores[row, ids[row]] * 2.5)
