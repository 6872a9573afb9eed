"""Tokenizing is bounded by the context window: a prompt that fits gets exactly the full
encoding; an oversized one is refused after encoding about the window's worth of text."""
from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken.server.prompt_tokens import CHARS_PER_TOKEN, encode_bounded


class Counting:
    def __init__(self, tok):
        self.tok, self.chars = tok, 0

    def encode(self, text):
        self.chars += len(text)
        return self.tok.encode(text)


def _tok(tiny_model_dir):
    from freetoken.tokenizer import Tokenizer
    return Tokenizer(tiny_model_dir)


def test_oversized_prompt_stops_early(tiny_model_dir):
    tok = Counting(_tok(tiny_model_dir))
    limit = 2000
    text = "hello world, this is a long line of text.\n" * 100_000      # 4.2 MB
    ids, n = encode_bounded(tok, text, limit)
    assert ids is None and n > limit
    assert tok.chars < 20 * CHARS_PER_TOKEN * limit, tok.chars      # not the 4.2 MB


@settings(max_examples=40, deadline=None)
@given(text=st.text(st.characters(codec="utf-8"), max_size=3000), limit=st.integers(1, 1500),
       chunk=st.sampled_from([7, 64, 32 << 10]))
def test_exact_when_it_fits_and_never_refuses_a_fitting_prompt(tiny_model_dir, text, limit, chunk):
    tok = _tok(tiny_model_dir)
    full = tok.encode(text)
    ids, n = encode_bounded(tok, text, limit, chunk)
    if ids is not None:
        assert ids == full and n == len(full)
    else:   # refused: it does not fit, up to the seams' slack
        seams = len(text) // chunk
        assert len(full) > limit - 2 * seams
