"""GLM-5.3-Flash (Glm5NextForConditionalGeneration, text part) against transformers: KDA linear
layers, NoPE MLA with the pooled DSA indexer (prompts several times longer than index_topk, so
later queries attend a few pools plus their tail), hyper-connections, clamped SwiGLU experts.
The reference is transformers' own model built from its config classes (`make-tiny glm5_next`)."""
from __future__ import annotations

import json

import pytest
import torch
import transformers

from freetoken import LLM
from freetoken.errors import CheckpointError
from freetoken.layers.attention.paged import kv_values_per_token

from helpers import assert_logits_close
from model_checks import (
    check_batch_equals_single,
    check_incremental_equals_full,
    check_prefix_cache_exact,
    check_snapshot_restore_equals_recompute,
    check_state_position_guard,
    ids_for,
)

SHARED = dict(layer_types=["linear_attention", "indexed_attention", "indexed_attention", "linear_attention",
                           "indexed_attention"],
              indexer_types=["full", "full", "shared", "full", "full"],
              mlp_layer_types=["dense", "sparse", "dense", "sparse", "sparse"])


def tiny(tiny_dir, layers=4, **kw):
    """make-tiny's glm5_next with weights large enough that a wrong state or selection shows."""
    return tiny_dir("glm5_next", layers=layers, initializer_range=0.1, **kw)


def reference(model_dir, ids) -> torch.Tensor:
    ref = transformers.Glm5NextForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return ref(input_ids=torch.tensor([ids])).logits[0].float()


def per_position_p95(ours, ref) -> float:
    return (ours - ref).abs().max(-1).values.quantile(0.95).item() / max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("kw", [{}, dict(layers=5, **SHARED), dict(index_kpool=8, index_topk=16),
                                dict(linear_lower_bound=None), dict(swiglu_limit=0.3)])
def test_logits_match_transformers(tiny_dir, kw):
    d = tiny(tiny_dir, **kw)
    ids = ids_for(70)
    ours, ref = LLM(str(d), dtype="float32").score(ids), reference(d, ids)
    assert per_position_p95(ours, ref) <= 1e-4
    assert_logits_close(ours, ref)


def test_pooled_selection_is_live(tiny_dir):
    """Letting every query attend every pool moves the result far from the reference."""
    d = tiny(tiny_dir)
    ids = ids_for(70)
    llm = LLM(str(d), dtype="float32")
    for layer in llm.engine.model.layers:
        if hasattr(layer.mixer, "indexer"):
            layer.mixer.indexer.topk = 10 ** 6
    ref = reference(d, ids)
    assert (llm.score(ids) - ref).abs().max() > 1e-2 * ref.abs().max()


def test_flat_text_config_reads_the_same(tiny_dir, tmp_path):
    """A text-only config.json (text fields at the top level) with the same weights."""
    import shutil
    src = tiny(tiny_dir)
    d = tmp_path / "flat"
    shutil.copytree(src, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg.pop("text_config"), "architectures": cfg["architectures"]}))
    ids = ids_for(40)
    assert_logits_close(LLM(str(d), dtype="float32").score(ids), LLM(str(src), dtype="float32").score(ids))


def test_incremental_decode_equals_full_forward(tiny_dir):
    check_incremental_equals_full(tiny(tiny_dir), prompt_len=13, steps=20)


def test_batch_equals_single(tiny_dir):
    check_batch_equals_single(tiny(tiny_dir))


def test_snapshot_restore_equals_recompute(tiny_dir):
    check_snapshot_restore_equals_recompute(tiny(tiny_dir), n=45, p=12)


def test_state_position_guard(tiny_dir):
    check_state_position_guard(tiny(tiny_dir))


def test_prefix_cache_serves_the_same_logits(tiny_dir):
    check_prefix_cache_exact(tiny(tiny_dir))


def test_only_mla_layers_keep_kv(tiny_dir):
    llm = LLM(str(tiny(tiny_dir)), dtype="float32", kv_cache_gib=0.001)
    # 2 MLA layers x (latent 32 + [indexer key | pool gate] 2 x 16); the KDA layers keep states instead
    assert kv_values_per_token(llm.engine.model.kv_layers()) == 2 * (32 + 32)
    assert sorted(llm.engine.runner.kv) == [1, 3]


def test_shared_layer_after_a_linear_layer_is_a_clear_error(tiny_dir, tmp_path):
    import shutil
    d = tmp_path / "bad"
    shutil.copytree(tiny(tiny_dir), d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["text_config"]["indexer_types"] = ["full", "shared", "full", "full"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="indexer_types"):
        LLM(str(d), dtype="float32")
