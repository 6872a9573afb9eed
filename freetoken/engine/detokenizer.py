"""Incremental detokenization with stop strings.

Text is decoded from a short window of ids so each step costs O(1) tokens, waits while
the tail is an incomplete UTF-8 sequence, and holds back as many characters as a stop
string could still need so that no part of a stop string is ever emitted."""
from __future__ import annotations


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids: list[int], stop: list[str]):
        self.tok = tokenizer
        self.ids = list(prompt_ids[-6:])        # context so leading spaces decode correctly
        self.prefix_offset, self.read_offset = 0, len(self.ids)
        self.text = ""
        self.emitted = 0
        self.stop = stop
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.matched_stop: str | None = None

    def add(self, token_id: int) -> bool:
        """Append one token; returns True when a stop string was found (text is cut before it)."""
        self.ids.append(token_id)
        prefix = self.tok.decode(self.ids[self.prefix_offset:self.read_offset])
        full = self.tok.decode(self.ids[self.prefix_offset:])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return False
        before = len(self.text)
        self.text += full[len(prefix):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        if len(self.ids) > 64:                   # keep the window short
            drop = self.prefix_offset
            self.ids = self.ids[drop:]
            self.prefix_offset, self.read_offset = 0, self.read_offset - drop
        if self.stop:
            start = max(0, before - self.holdback)
            hits = [(i, s) for i, s in ((self.text.find(s, start), s) for s in self.stop) if i >= 0]
            if hits:
                i, self.matched_stop = min(hits)
                self.text = self.text[:i]
                return True
        return False

    def take(self, final: bool) -> str:
        """New text that is safe to show (everything, once the sequence is finished)."""
        end = len(self.text) if final else max(self.emitted, len(self.text) - self.holdback)
        out = self.text[self.emitted:end]
        self.emitted = end
        return out
