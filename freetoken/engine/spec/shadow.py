"""Proposals the price did not draft, scored against what the sequence emitted next.

A proposal made at a sequence's length n (its tokens the drafter's guess at ids[n:n+k]) is
kept until the sequence has emitted enough tokens to tell how many of them it would have
accepted (a mismatch, or all k matched); then the acceptance statistics learn from it as
from a verify, at no cost. This is what lets a price that rejects every draft at the prior
(a MoE whose verify of 2 positions costs 1.4-1.6 plain steps) still learn that a bucket pays,
and what lets it learn fast that one stopped paying (random text, a new kind of session)."""
from __future__ import annotations

from .acceptance import AcceptanceStats
from .drafters import Draft


def matched(draft: tuple[int, ...], emitted: list[int]) -> tuple[int, bool]:
    """(tokens of `draft` that `emitted` confirms in order, whether that is final)."""
    n = 0
    for d, t in zip(draft, emitted):
        if d != t:
            return n, True
        n += 1
    return n, n == len(draft)


class ShadowScores:
    def __init__(self, stats: AcceptanceStats, max_pending: int = 16):
        self.stats, self.max_pending = stats, max_pending
        self._pending: dict = {}             # sequence key -> [(Draft, length when proposed)]

    def keep(self, key, draft: Draft, length: int) -> None:
        """`draft` was proposed for the sequence `key` at `length` tokens and not verified."""
        rows = self._pending.setdefault(key, [])
        rows.append((draft, length))
        del rows[:-self.max_pending]

    def settle(self, key, ids: list[int]) -> None:
        """The sequence `key` now holds `ids`: score the proposals whose outcome is known."""
        rows = self._pending.get(key)
        if not rows:
            return
        left = []
        for draft, n0 in rows:
            n, final = matched(draft.tokens, ids[n0:])
            if final:
                self.stats.observe_shadow(draft.drafter, draft.bucket, len(draft.tokens), n)
            else:
                left.append((draft, n0))
        self._pending[key] = left

    def forget(self, key) -> None:
        """The sequence ended: what it did not emit is not known, so its open proposals go."""
        self._pending.pop(key, None)
