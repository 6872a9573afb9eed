"""Token strings, bytes and text offsets of the logprobs objects with a real vocabulary
(Qwen2's byte-level BPE from a GGUF): the tokens' bytes put together are the text, a
token that is part of a character shows as `bytes:\\x..` with exact bytes, offsets count
characters of the decoded text, special tokens show as themselves."""
from types import SimpleNamespace

import pytest

from helpers import SHARED_DATA

from freetoken.engine.logprobs import TokenLogprob
from freetoken.server.grammar import build_tokenizer
from freetoken.server.api.logprobs import NEG_INF, TokenStrings, chat_logprobs, completion_logprobs

VOCAB = SHARED_DATA / "tokenizers" / "ggml-vocab-qwen2.gguf"


@pytest.fixture(scope="module")
def strings():
    if not VOCAB.is_file():
        pytest.skip(f"no vocabulary at {VOCAB}")
    from freetoken.tokenizer import Tokenizer
    tok = Tokenizer(VOCAB)
    return tok, TokenStrings(SimpleNamespace(tokenizer=tok, grammar_tokenizer=lambda: build_tokenizer(tok)))


@pytest.mark.parametrize("text", ["Hello wörld — 日本", "Hello 𓀀𓀁 🦜 x", "<|im_end|> after"])
def test_bytes_join_to_the_text_and_offsets_count_characters(strings, text):
    tok, ts = strings
    ids = tok.encode(text)
    entries = [(t, TokenLogprob(t, -1.0, [(t, -1.0)])) for t in ids]
    obj, end = completion_logprobs(ts, entries, start_offset=3)
    assert b"".join(ts.get(t)[1] for t in ids).decode() == tok.decode(ids) == text
    assert end == 3 + len(text)
    for t, s, off in zip(ids, obj["tokens"], obj["text_offset"]):
        b = ts.get(t)[1]
        try:
            assert s == b.decode() and text[off - 3:].startswith(s)
        except UnicodeDecodeError:                    # part of a character
            assert s == "bytes:" + "".join(f"\\x{c:02x}" for c in b)


def test_minus_inf_is_written_as_openai_does_and_chat_shape(strings):
    tok, ts = strings
    t = tok.encode("hi")[0]
    e = TokenLogprob(t, float("-inf"), [(t, float("-inf"))])
    obj, _ = completion_logprobs(ts, [(t, None), (t, e)])
    assert obj["token_logprobs"] == [None, NEG_INF] and obj["top_logprobs"][0] is None
    chat = chat_logprobs(ts, [e], 1)
    assert chat["content"][0]["logprob"] == NEG_INF and chat["content"][0]["bytes"] == list(b"hi")
