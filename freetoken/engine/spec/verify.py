"""The acceptance rule, one position at a time, so that speculation never changes what is
generated. Each position's token is the one plain decoding would take: the argmax of the same
processed logits (greedy), or the inverse-CDF draw on the same uniform of the sequence's
generator (sampled: `sampler.draw`, one uniform per emitted token in both). A drafted token is
accepted when it is that token. For a deterministic drafter (q one-hot on the drafted d) this
is the speculative-sampling rule realised as a coupling: d is accepted with probability p(d),
and otherwise the token is distributed as p with d removed (the residual max(0, p - q),
renormalised); on top of keeping the distribution, a seed gives the same tokens with and
without speculation. p is what plain decoding samples from at that position: processors
(grammar state advanced by the accepted tokens only), penalties counting the accepted tokens,
temperature, top-k/top-p/min-p."""
from __future__ import annotations

import torch

from .. import sampler


def choose(logits: torch.Tensor, seq, draft: int | None) -> tuple[int, bool]:
    """(the token at this position, whether it is the drafted one). logits [V] (not modified)."""
    tok = sampler.sample_one(logits.clone(), seq)
    return tok, tok == draft


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
