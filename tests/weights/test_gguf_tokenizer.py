"""GGUF vocabularies converted to `tokenizers` give llama.cpp's own token ids (.inp/.out
test files shipped with the vocabularies), and the metadata reader agrees with gguf's writer."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import SHARED_DATA

from freetoken.errors import CheckpointError
from freetoken.tokenizer import Tokenizer
from freetoken.weights.gguf.tokenizer import load_gguf_tokenizer

TOKENIZERS = SHARED_DATA / "tokenizers"


def cases(vocab):
    base = TOKENIZERS / f"ggml-vocab-{vocab}.gguf"
    texts = base.with_name(base.name + ".inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    ids = base.with_name(base.name + ".out").read_text().split("\n")
    return list(zip(texts, ([int(x) for x in line.split()] for line in ids)))


@pytest.mark.parametrize("vocab", ["qwen2", "qwen35", "deepseek-llm"])
def test_matches_llamacpp_token_ids(real_tokenizer_dir, vocab):
    tok = Tokenizer(real_tokenizer_dir(vocab))
    pairs = cases(vocab)
    assert len(pairs) > 40
    for text, expected in pairs:
        assert tok.encode(text) == expected, text
        assert tok.decode(expected) == text


def test_special_tokens_and_template(real_tokenizer_dir):
    tok = Tokenizer(real_tokenizer_dir("qwen2"))
    for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert len(tok.encode(t)) == 1
    assert tok.eos_token == "<|endoftext|>"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text.endswith("<|im_start|>assistant\n")
    ds = Tokenizer(real_tokenizer_dir("deepseek-llm"))
    assert ds.bos_token == "<｜begin▁of▁sentence｜>"
    assert ds.encode("<｜end▁of▁sentence｜>") == [100001]


def test_reader_round_trips_gguf_writer(tmp_path):
    gguf = pytest.importorskip("gguf")
    tokens = ["a", "b", "ab", "Ġ", "<|x|>", "<think>"]
    path = tmp_path / "t.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_merges(["a b"])
    w.add_token_types([1, 1, 1, 1, 3, 4])
    w.add_eos_token_id(4)
    w.add_chat_template("{{ messages[0].content }}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tok, cfg = load_gguf_tokenizer(path)
    assert cfg["eos_token"] == "<|x|>" and cfg["chat_template"] == "{{ messages[0].content }}"
    assert tok.encode("ab<|x|>b<think>").ids == [2, 4, 1, 5]
    assert tok.decode([2, 4, 5], skip_special_tokens=True) == "ab<think>"


def test_bad_files_name_the_file(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + b"\0" * 20)
    with pytest.raises(CheckpointError, match="bad.gguf: not a readable GGUF"):
        load_gguf_tokenizer(bad)


def test_header_skips_string_arrays_exactly(tmp_path):
    """Skipping string arrays (GgufFile's parse, the tokenizer's `keys=` filter) lands on the
    same next field as decoding them: the keys after the vocabulary read the same."""
    gguf = pytest.importorskip("gguf")
    from freetoken.weights.gguf.meta import read_header
    path = tmp_path / "s.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_token_list(["a", "bé", "", "ccc" * 50])
    w.add_token_merges(["a b", "b c"])
    w.add_uint32("llama.block_count", 3)
    w.add_string("z.after", "end")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    full = read_header(path).fields
    assert full["tokenizer.ggml.tokens"] == ["a", "bé", "", "ccc" * 50]
    lean = read_header(path, string_arrays=False).fields
    assert lean["tokenizer.ggml.tokens"] is None and lean["tokenizer.ggml.merges"] is None
    assert {k: v for k, v in lean.items() if v is not None} == {k: v for k, v in full.items()
                                                                if not k.startswith("tokenizer.ggml.")}
    assert read_header(path, tensors=False, keys="z.").fields["z.after"] == "end"   # arrays skipped, not kept


def test_gguf_tokenizer_object_matches_its_json():
    """A GGUF's tokenizer is built straight from its metadata (no JSON round trip at start):
    the object tokenizer.json serializes, shared by every Tokenizer of that file, and it gives
    llama.cpp's token ids."""
    from tokenizers import Tokenizer as HF

    from freetoken.weights.source import read_model_text, read_model_tokenizer
    path = TOKENIZERS / "ggml-vocab-qwen2.gguf"
    if not path.is_file():
        pytest.skip(f"{path} not found (shared data is not checked out)")
    obj = read_model_tokenizer(path)
    assert obj.to_str() == HF.from_str(read_model_text(path, "tokenizer.json")).to_str()
    tok = Tokenizer(path)
    assert tok.hf is obj
    for text, expected in cases("qwen2"):
        assert tok.encode(text) == expected, text


PRE_CASES = Path(__file__).with_name("data") / "pre_tokenizers.json"


@pytest.mark.parametrize("pre", ["glm4", "minimax-m2", "kimi-k2", "llama-bpe"])
def test_pre_tokenizers_match_llamacpp(tmp_path, pre):
    """The splits of GLM-4.5/5, MiniMax-M2, Kimi-K2 and Llama 3 (with llama.cpp's ignore_merges)
    on the qwen2 test vocabulary give the ids llama.cpp itself gave for the same file
    (data/pre_tokenizers.json, written by make_pre_tokenizer_cases.py)."""
    from gguf_rewrite import rewrite
    data = json.loads(PRE_CASES.read_text(encoding="utf-8"))
    src = TOKENIZERS / data["vocab"]
    if not src.is_file():
        pytest.skip(f"{src} is not here (../shared/data)")
    g = rewrite(src, tmp_path / f"{pre}.gguf", set_keys={"tokenizer.ggml.pre": pre})
    tok, _ = load_gguf_tokenizer(g)
    for text, expected in data["cases"][pre]:
        if pre == "kimi-k2" and text in LLAMACPP_K2_JOINS_CASES:
            continue
        assert tok.encode(text, add_special_tokens=False).ids == expected, (pre, text)


# llama.cpp's hand-written Kimi-K2 split takes a letter run whole across a case change (" XMLHttpRequest"),
# where the model's own tokenizer (tiktoken, below) splits " XMLHttp" | "Request": we follow the model's
LLAMACPP_K2_JOINS_CASES = ("HelloWorld CamelCaseWords and XMLHttpRequest",)
# tokenization_kimi.py's pat_str, as Kimi-K2's tiktoken tokenizer runs it
KIMI_TIKTOKEN = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+"])


def test_kimi_k2_split_is_tiktokens():
    """Our Kimi-K2 split (tokenizers' Oniguruma) cuts every test text where tiktoken's pattern,
    run by the `regex` module, cuts it."""
    regex = pytest.importorskip("regex")
    from tokenizers import Regex, pre_tokenizers

    from freetoken.weights.gguf.tokenizer import PRE_TOKENIZERS
    split = pre_tokenizers.Split(Regex(PRE_TOKENIZERS["kimi-k2"][0]), behavior="isolated")
    texts = [t for t, _ in json.loads(PRE_CASES.read_text(encoding="utf-8"))["cases"]["kimi-k2"]]
    for text in texts:
        assert [p for p, _ in split.pre_tokenize_str(text)] == regex.findall("(?V1)" + KIMI_TIKTOKEN, text), text
