"""One small interface for every drafter: `propose(context, k)` returns up to k tokens the
sequence is likely to emit next, with a confidence bucket the acceptance statistics key on."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Draft:
    tokens: tuple[int, ...]
    drafter: str            # which drafter made it (statistics, metrics)
    bucket: int             # confidence bucket: drafts of one bucket share acceptance statistics


class Drafter(Protocol):
    name: str

    def propose(self, context: list[int], k: int) -> Draft | None:
        """Up to k next tokens after `context` (a sequence's prompt + output), or None."""

    def observe(self, key, tokens: list[int], start: int) -> None:
        """The sequence `key` now holds `tokens` (new ones from index `start`): index them."""

    def forget(self, key) -> None:
        """The sequence `key` ended (its tokens may stay indexed for others)."""


# whether the drafter's last proposal for the sequence predicted the tokens emitted since
NO_STREAK, MISSED, PREDICTED = 0, 1, 2
NO_SPLIT = 4          # split band of a draft whose earlier occurrences agree on every token


def split_band(first_split: int | None) -> int:
    """The index of a draft's first token on which the earlier occurrences disagreed (the suffix
    walk took the majority): 0, 1-3, 4-7, 8+, or none (NO_SPLIT). On the replay's sessions such a
    token was accepted 11-37% of the time after accepted ones, an agreed one 82-96%: where the
    first split sits bounds the run."""
    if first_split is None:
        return NO_SPLIT
    return 0 if first_split == 0 else 1 if first_split < 4 else 2 if first_split < 8 else 3


def match_bucket(match_len: int, count: int, streak: int = NO_STREAK, split: int = NO_SPLIT) -> int:
    """Confidence bucket from the matched context length and how many earlier occurrences agree
    on the continuation (4 length bands x 3 count bands), whether the drafter's last proposal
    for the sequence held (`Streaks`) and the draft's split band (`split_band`)."""
    band = 0 if match_len <= 2 else 1 if match_len <= 5 else 2 if match_len <= 11 else 3
    agree = 0 if count <= 1 else 1 if count <= 3 else 2
    return ((band * 3 + agree) * 3 + streak) * (NO_SPLIT + 1) + split


NUM_BUCKETS = 4 * 3 * 3 * (NO_SPLIT + 1)


class Streaks:
    """Per sequence, a drafter's proposal at the sequence's last drafting step (the length it was
    made at, its tokens) and, at the next, whether it predicted every token emitted since. Inside a
    copied run the proposals keep holding; just past a miss (the token a verify corrected)
    they hold less: on the replay's sessions the suffix index's first token was accepted 81%
    after a proposal that held, 57% after one that missed, prompt lookup's 68% / 27%."""

    def __init__(self):
        self._last: dict = {}

    def state(self, key, context: list[int]) -> int:
        last = self._last.get(key) if key is not None else None
        if last is None or len(context) <= last[0]:
            return NO_STREAK
        n0, toks = last
        seen = context[n0:n0 + len(toks)]
        return PREDICTED if list(toks[:len(seen)]) == seen else MISSED

    def keep(self, key, context: list[int], draft: Draft | None) -> None:
        """The proposal made now (None: none, so the next one's streak is not known)."""
        if draft is not None and key is not None:
            self._last[key] = (len(context), draft.tokens)
        else:
            self._last.pop(key, None)

    def forget(self, key) -> None:
        self._last.pop(key, None)


def with_agreement(drafts: list[Draft]) -> list[Draft]:
    """The proposals with their buckets refined by the other drafters': proposed alone, beside a
    proposal with another first token, or all agreeing on the first token. On the trace MoE's
    replay prompt lookup's first token is right 85% of the time where the suffix index agrees,
    21% alone and 6% where it disagrees; the suffix index's 85% / 87% / 72%: the match bucket
    alone cannot tell these apart."""
    if len(drafts) < 2:
        return drafts
    agree = len({d.tokens[0] for d in drafts}) == 1
    shift = NUM_BUCKETS * (2 if agree else 1)
    return [Draft(d.tokens, d.drafter, d.bucket + shift) for d in drafts]
