"""Incremental detokenization with stop strings.

Text is decoded from a short window of ids so each step costs O(1) tokens, waits while
the tail is an incomplete UTF-8 sequence, and holds back as many characters as a stop
string could still need so that no part of a stop string is ever emitted. Stop strings
are found with one Aho-Corasick automaton (built once per request) over the new text and
the held-back tail, so a step costs the same however many stop strings there are."""
from __future__ import annotations

import ahocorasick


def stop_automaton(stop: list[str]):
    a = ahocorasick.Automaton()
    for s in stop:
        a.add_word(s, s)
    a.make_automaton()
    return a


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids: list[int], stop: list[str]):
        self.tok = tokenizer
        self.ids = list(prompt_ids[-6:])        # context so leading spaces decode correctly
        self.prefix_offset, self.read_offset = 0, len(self.ids)
        self.text = ""
        self.emitted = 0
        self.stop = stop
        self.matcher = stop_automaton(stop) if stop else None
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
        if self.matcher is not None:
            start = max(0, before - self.holdback)
            # the earliest-starting stop string (ties: the smallest), as min(text.find(s)) would
            hits = [(end - len(s) + 1, s) for end, s in self.matcher.iter(self.text, start)]
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
