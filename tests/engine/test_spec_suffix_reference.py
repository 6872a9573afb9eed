"""The suffix drafter reproduces a brute-force one on real agent sessions: tokens per verify
step with the recorded responses forced, within 10%. The reference searches the whole history
(every earlier session and the present one) for the longest match of the context's suffix (up
to 64 tokens), takes every occurrence and walks the majority continuation: no index, no caps,
no bound on memory."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from helpers import SHARED_DATA

from freetoken.engine.spec.drafters import Draft
from freetoken.engine.spec.replay import load_sessions, tokens_per_verify
from freetoken.engine.spec.suffix import MIN_AGREE, SuffixDrafter

SESSIONS = SHARED_DATA / "agent-sessions"
PICK = {"psf__requests-2931", "sympy__sympy-21612"} | {f"gpt-4o-airline-{i}" for i in range(0, 40, 3)}


class BruteSuffix:
    name = "brute"

    def __init__(self, max_len: int = 64):
        self.history = np.zeros(0, np.int64)
        self.live: dict = {}
        self.max_len = max_len

    def observe(self, key, tokens, start=0):
        self.live[key] = list(tokens)

    def forget(self, key):
        self.history = np.concatenate([self.history, np.array(self.live.pop(key), np.int64), [-1]])

    def propose(self, ctx, k, key=None):
        h = np.concatenate([self.history, np.array(ctx, np.int64)])
        ends = np.flatnonzero(h[:-1] == ctx[-1])       # matches ending at p (continued at p + 1)
        best, m = ends, 1
        while len(ends) and m < min(self.max_len, len(ctx)):
            ends = ends[ends >= m]
            ends = ends[h[ends - m] == ctx[-1 - m]]
            if len(ends):
                best, m = ends, m + 1
        occ, out = list(best + 1), []
        for i in range(k):
            nxt = Counter(int(h[p + i]) for p in occ if p + i < len(h) and h[p + i] >= 0)
            if not nxt:
                break
            tok, cnt = nxt.most_common(1)[0]
            if cnt < MIN_AGREE * len(occ):
                break
            out.append(tok)
            occ = [p for p in occ if p + i < len(h) and h[p + i] == tok]
        return Draft(tuple(out), "brute", 0) if out else None


def test_suffix_drafter_within_10_percent_of_brute_force(real_tokenizer_dir):
    if not SESSIONS.is_dir():
        pytest.skip(f"agent sessions not found at {SESSIONS}")
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(real_tokenizer_dir("qwen2") / "tokenizer.json"))
    sessions = load_sessions(SESSIONS, max_turns=6, names=PICK)
    assert len(sessions) == len(PICK)
    ids = [[(tok.encode(p).ids, tok.encode(r).ids) for p, r in turns] for _, turns in sessions]
    for k in (8, 16):
        ours, n, _ = tokens_per_verify(SuffixDrafter(), ids, k)
        ref, n_ref, _ = tokens_per_verify(BruteSuffix(), ids, k)
        assert n == n_ref > 2000
        assert ref > 1.3                          # the sessions do repeat themselves
        assert abs(ours - ref) <= 0.1 * ref, (k, ours, ref)
