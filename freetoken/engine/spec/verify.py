"""The acceptance rule, one position at a time, so that speculation never changes what is
generated: greedy output is the argmax of the same processed logits plain decoding takes;
sampled output follows the speculative-sampling rule for a deterministic drafter (its q is
one-hot on the drafted token d): accept d with probability p(d), else draw from p with d
removed (the residual max(0, p - q), renormalised). p is the distribution plain decoding
would sample from at that position: processors (grammar state advanced by the accepted
tokens only), penalties counting the accepted tokens, temperature, top-k/top-p/min-p."""
from __future__ import annotations

import torch

from .. import sampler


def choose(logits: torch.Tensor, seq, draft: int | None) -> tuple[int, bool]:
    """(the token at this position, whether it is the drafted one). logits [V] (not modified)."""
    probs, processed = sampler.distribution(logits.clone(), seq)
    if probs is None:
        tok = int(torch.argmax(processed))
        return tok, tok == draft
    probs = probs.cpu()
    if draft is None:
        return int(torch.multinomial(probs, 1, generator=seq.generator)), False
    probs = probs / probs.sum()
    u = float(torch.rand(1, generator=seq.generator))
    if u < float(probs[draft]):
        return draft, True
    residual = probs.clone()
    residual[draft] = 0.0
    if not float(residual.sum()) > 0.0:       # p(d) == 1 up to rounding
        return draft, True
    return int(torch.multinomial(residual, 1, generator=seq.generator)), False


def greedy_run(rows: torch.Tensor, draft: list[int]) -> list[int]:
    """Plain greedy sequences (no processors or penalties): the tokens of the k+1 rows up to and
    including the first that differs from the draft, from one batched argmax."""
    toks = sampler.greedy_tokens(rows)
    out = []
    for i, t in enumerate(toks):
        out.append(t)
        if i >= len(draft) or t != draft[i]:
            break
    return out
