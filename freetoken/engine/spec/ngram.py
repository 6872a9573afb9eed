"""Prompt lookup (llama.cpp's `--lookup`/prompt-lookup decoding): find the last n tokens of the
sequence earlier in the same sequence (longest n first, the most recent occurrence) and
propose what followed. Per sequence, nothing shared; the index grows with the sequence."""
from __future__ import annotations

from .drafters import Draft, match_bucket

ORDERS = (6, 5, 4, 3, 2, 1)


class NgramDrafter:
    name = "ngram"

    def __init__(self, orders=ORDERS):
        self.orders = tuple(sorted(orders, reverse=True))
        self._index: dict = {}             # key -> {ngram tuple: last start position of what follows}
        self._len: dict = {}

    def observe(self, key, tokens: list[int], start: int) -> None:
        idx = self._index.setdefault(key, {})
        done = self._len.get(key, 0)
        # position p is indexed once tokens[p] exists: ngram tokens[p-n:p] -> p
        for p in range(max(done, 1), len(tokens)):
            for n in self.orders:
                if p - n >= 0:
                    idx[tuple(tokens[p - n:p])] = p
        self._len[key] = max(done, len(tokens))

    def forget(self, key) -> None:
        self._index.pop(key, None)
        self._len.pop(key, None)

    def propose(self, context: list[int], k: int, key=None) -> Draft | None:
        idx = self._index.get(key)
        if not idx or k <= 0:
            return None
        for n in self.orders:
            if n > len(context):
                continue
            p = idx.get(tuple(context[-n:]))
            if p is not None and p < len(context):
                # what followed the match; a match running into the present repeats its own start
                out = context[p:p + k]
                if out:
                    return Draft(tuple(out), self.name, match_bucket(n, 1))
        return None
