"""SentencePiece ('llama') and Gemma-4 GGUF vocabularies tokenize exactly as the original:
- Gemma 4's real vocabulary gives llama.cpp's own token ids (.inp/.out shipped with it);
- an SPM vocabulary made from it (the real tokens, each scored by the rank of the merge that
  first builds it, as a SentencePiece BPE model scores its pieces) gives llama.cpp's own SPM
  tokenizer's ids, with and without the leading-space prefix;
- a SentencePiece model trained here and written by llama.cpp's converter
  (`_set_vocab_sentencepiece`) into a Mixtral GGUF tokenizes as `sentencepiece` itself."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import SHARED_DATA
from test_gguf_tokenizer import cases

from freetoken import LLM
from freetoken.errors import CheckpointError
from freetoken.sampling_params import SamplingParams
from freetoken.tokenizer import Tokenizer
from freetoken.weights.gguf.meta import read_header
from freetoken.weights.gguf.tokenizer import load_gguf_tokenizer, save_tokenizer_dir

GEMMA4 = SHARED_DATA / "tokenizers" / "ggml-vocab-gemma-4.gguf"
VARIED = ["def f(x):\n    return x**2  # 平方\n\tpass", "emoji 🦙🔥👩‍👩‍👧 ok", "  leading and trailing  ",
          "Ünïcödé ñ 日本語のテキスト 한국어 العربية", "\x00\x01 ctrl \x7f", "x" * 300, "日" * 50, " ", "",
          "a<eos>b <bos> c<|tool_call>x", "<0x41> is literal text", "    indented\n\n\n\n    code\r\n"]


def write_vocab(path: Path, model: str, tokens, types, scores=None, merges=None, **flags) -> Path:
    import gguf
    w = gguf.GGUFWriter(str(path), "llama")
    # the hyper-parameters llama.cpp reads even when loading only the vocabulary
    w.add_context_length(128), w.add_embedding_length(64), w.add_block_count(1)
    w.add_feed_forward_length(128), w.add_head_count(4), w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    if scores is not None:
        w.add_token_scores(scores)
    if merges is not None:
        w.add_token_merges(merges)
    for key, value in flags.items():
        getattr(w, f"add_{key}")(value)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def gemma4_fields():
    if not GEMMA4.is_file():
        pytest.skip(f"real tokenizers not found at {GEMMA4.parent}")
    return read_header(GEMMA4, tensors=False, keys="tokenizer.").fields


def test_gemma4_vocab_matches_llamacpp_token_ids(real_tokenizer_dir):
    tok = Tokenizer(real_tokenizer_dir("gemma-4"))
    pairs = cases("gemma-4")
    assert len(pairs) > 40
    for text, expected in pairs:
        assert tok.encode(text) == expected, text
        assert tok.decode(expected) == text
    assert tok.bos_token == "<bos>" and tok.hf.encode("hi", add_special_tokens=True).ids[0] == 2


@pytest.mark.parametrize("space_prefix", [True, False])
def test_spm_vocab_matches_llamacpp_spm_tokenizer(gemma4_fields, tmp_path, space_prefix):
    llama_cpp = pytest.importorskip("llama_cpp")
    f = gemma4_fields
    tokens, merges = f["tokenizer.ggml.tokens"], f["tokenizer.ggml.merges"]
    first: dict[str, int] = {}
    for rank, m in enumerate(merges):
        k = m.find(" ", 1)
        first.setdefault(m[:k] + m[k + 1:], rank)
    scores = [-float(first.get(t, 10 ** 6)) for t in tokens]
    path = write_vocab(tmp_path / "spm.gguf", "llama", tokens, f["tokenizer.ggml.token_type"], scores=scores,
                       bos_token_id=2, eos_token_id=1, unk_token_id=3, add_space_prefix=space_prefix)
    tok = Tokenizer(save_tokenizer_dir(path, tmp_path / "tok"))
    ref = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    texts = [t for t, _ in cases("gemma-4")] + VARIED
    for text in texts:
        expected = ref.tokenize(text.encode(), add_bos=False, special=True)
        assert tok.encode(text) == expected, text
        assert tok.hf.encode(text, add_special_tokens=True).ids == [2] + expected     # SPM adds BOS by default
        if "<" not in text:
            assert tok.decode(expected) == text
    if not space_prefix:        # scored merges reach the same tokens as the file's own merges
        for text, expected in cases("gemma-4"):
            assert tok.encode(text) == expected, text


SPM_TRAIN = ["The quick brown fox jumps over the lazy dog.", "def main():\n    print('hello, world')\n",
             "Los niños comen manzanas. Les élèves étudient à l'école.", "日本語の文章とカタカナ、ひらがな。",
             "Numbers 12345 and symbols #$%&*() [brackets] {braces}", "    indented code\twith tabs\n\n",
             "Mixture of experts routes each token to a few experts.", "Ελληνικά και русский текст тоже."]


@pytest.fixture(scope="module")
def spm_mixtral(tmp_path_factory, tiny_dir):
    """A tiny Mixtral checkpoint whose tokenizer is a SentencePiece BPE model trained here."""
    spm = pytest.importorskip("sentencepiece")
    import shutil
    root = tmp_path_factory.mktemp("spm")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(SPM_TRAIN * 20), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(root / "sp"), vocab_size=400,
                                   model_type="bpe", byte_fallback=True, character_coverage=0.98,
                                   user_defined_symbols=["<tool_call>", "</tool_call>"], minloglevel=2,
                                   add_dummy_prefix=True, remove_extra_whitespaces=False,
                                   normalization_rule_name="identity")
    sp = spm.SentencePieceProcessor(model_file=str(root / "sp.model"))
    model = root / "mixtral"
    shutil.copytree(tiny_dir("mixtral", vocab=sp.vocab_size()), model)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (model / f).unlink(missing_ok=True)
    shutil.copy(root / "sp.model", model / "tokenizer.model")
    # real checkpoints list their added pieces here; llama.cpp's converter takes their types from it
    added = {str(sp.piece_to_id(t)): {"content": t, "special": False} for t in ("<tool_call>", "</tool_call>")}
    (model / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": added}))
    config = json.loads((model / "config.json").read_text())
    config.update(bos_token_id=1, eos_token_id=2, vocab_size=sp.vocab_size())
    (model / "config.json").write_text(json.dumps(config))
    return model, sp


def test_spm_gguf_from_llamacpp_converter_tokenizes_like_sentencepiece(spm_mixtral, to_gguf, tmp_path):
    model, sp = spm_mixtral
    path = to_gguf(model)
    fields = read_header(path, tensors=False, keys="tokenizer.").fields
    assert fields["tokenizer.ggml.model"] == "llama"
    tok = Tokenizer(save_tokenizer_dir(path, tmp_path / "tok"))
    plain = [t for t in SPM_TRAIN + VARIED + ["unseen: Ωμέγα ∑ 🧪 ZZZ qqq"] if "<" not in t]
    for text in plain:
        assert tok.encode(text) == sp.encode(text), text
        assert tok.decode(sp.encode(text)) == sp.decode(sp.encode(text)), text
    # added pieces stay whole; after one, llama.cpp (unlike sentencepiece) restarts the text with
    # the "▁" prefix: the GGUF's reader is what serves the file, so that is what we follow
    special = "call <tool_call>x</tool_call> done"
    assert tok.encode(special) == sp.encode("call ") + [sp.piece_to_id("<tool_call>")] + sp.encode("x") + \
        [sp.piece_to_id("</tool_call>")] + sp.encode(" done")
    out = LLM(str(path), dtype="float32").generate(SPM_TRAIN[0], SamplingParams(max_tokens=3, temperature=0))[0]
    assert out.prompt_token_ids == sp.encode(SPM_TRAIN[0]) and len(out.token_ids) == 3   # the model runs on it
    try:
        import llama_cpp
    except ImportError:
        return
    ref = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    for text in plain + [special]:
        assert tok.encode(text) == ref.tokenize(text.encode(), add_bos=False, special=True), text


@pytest.mark.parametrize("model,what", [("t5", "Unigram"), ("bert", "WordPiece"), ("rwkv", "RWKV"),
                                        ("whatever", "")])
def test_unsupported_vocab_types_are_refused_by_name(tmp_path, model, what):
    path = write_vocab(tmp_path / "v.gguf", model, ["<unk>", "a", "b"], [2, 1, 1], scores=[0.0, -1.0, -2.0])
    with pytest.raises(CheckpointError, match=rf"v.gguf: tokenizer.ggml.model = '{model}'.*{what}.*cannot be "
                                              r"converted \(expected one of 'gpt2'.*'llama'.*'gemma4'\)"):
        load_gguf_tokenizer(path)


def test_spm_without_scores_is_refused(tmp_path):
    path = write_vocab(tmp_path / "v.gguf", "llama", ["<unk>", "a", "b"], [2, 1, 1])
    with pytest.raises(CheckpointError, match="tokenizer.ggml.scores has 0 entries, expected 3"):
        load_gguf_tokenizer(path)
