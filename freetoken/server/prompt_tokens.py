"""Tokenize a prompt with work bounded by the context window, not by the text's size.

A prompt of at most ~3 characters per token of context is encoded whole. A longer one is
most likely over the window, so it is counted in chunks first, stopping as soon as the
count passes the window: a 30 MB message costs the window's worth of tokenizing, not all
of it, and the GIL is released between chunks so the other streams keep moving. Splitting
at chunk seams can only add a token or two per seam, so the early count never undercounts
a prompt that fits by more than that."""
from __future__ import annotations

CHUNK_CHARS = 32 << 10
CHARS_PER_TOKEN = 3      # below most tokenizers' average, so short prompts skip the pre-count


def count_upto(tokenizer, text: str, limit: int, chunk: int = CHUNK_CHARS) -> int:
    """Tokens in text counted chunk by chunk, stopping once past limit."""
    n = 0
    for i in range(0, len(text), chunk):
        n += len(tokenizer.encode(text[i:i + chunk]))
        if n > limit:
            break
    return n


def encode_bounded(tokenizer, text: str, limit: int,
                   chunk: int = CHUNK_CHARS) -> tuple[list[int] | None, int]:
    """(ids, n): the ids when the text may fit `limit` tokens, else (None, a count > limit)."""
    if len(text) > CHARS_PER_TOKEN * limit:
        n = count_upto(tokenizer, text, limit, chunk)
        if n > limit:
            return None, n
    ids = tokenizer.encode(text)
    return ids, len(ids)
