"""Perplexity the way llama.cpp's `llama-perplexity` measures it, so the two numbers compare:
the text is tokenized once (with BOS where the vocabulary adds one), cut into whole chunks of
n_ctx tokens (the tail that does not fill one is dropped), each chunk's first token replaced by
BOS when the vocabulary adds one, every chunk evaluated on its own from an empty context, and
only the second half of each chunk scored (each scored token then sees at least n_ctx/2 tokens
of context): logits at positions n_ctx/2 .. n_ctx-2 predict the tokens after them."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch


@dataclass
class Perplexity:
    nll_sum: float = 0.0
    nll2_sum: float = 0.0
    count: int = 0
    chunk_ppl: list = field(default_factory=list)    # running estimate after each chunk

    def add(self, nll: torch.Tensor) -> None:
        self.nll_sum += float(nll.sum())
        self.nll2_sum += float((nll * nll).sum())
        self.count += nll.numel()
        self.chunk_ppl.append(self.ppl)

    @property
    def ppl(self) -> float:
        return math.exp(self.nll_sum / self.count) if self.count else float("nan")

    @property
    def err(self) -> float:
        """Standard error of the estimate (llama-perplexity's `+/-`)."""
        if self.count < 2:
            return float("nan")
        mean = self.nll_sum / self.count
        var = self.nll2_sum / self.count - mean * mean
        return self.ppl * math.sqrt(max(var, 0.0) / (self.count - 1))


def chunks(tokens: list[int], n_ctx: int, bos_id: int | None, max_chunks: int | None = None) -> Iterator[list[int]]:
    """The evaluated windows: whole chunks of n_ctx tokens, the first set to BOS if given."""
    if n_ctx < 4:
        raise ValueError(f"n_ctx is {n_ctx}, expected at least 4")
    n = len(tokens) // n_ctx
    if max_chunks is not None:
        n = min(n, max_chunks)
    for i in range(n):
        chunk = list(tokens[i * n_ctx:(i + 1) * n_ctx])
        if bos_id is not None:
            chunk[0] = bos_id
        yield chunk


def scored(logits: torch.Tensor, chunk: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probabilities [n, vocab] in float64, target ids [n]) of a chunk's scored half."""
    first = len(chunk) // 2
    logp = torch.log_softmax(logits[first:len(chunk) - 1].double(), dim=-1)
    return logp, torch.tensor(chunk[first + 1:])


def nll(logp: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return -logp.gather(1, targets[:, None])[:, 0]


def perplexity(score: Callable[[list[int]], torch.Tensor], tokens: list[int], n_ctx: int,
               bos_id: int | None, max_chunks: int | None = None,
               on_chunk: Callable[[int, Perplexity], None] | None = None) -> Perplexity:
    """`score(chunk)` -> float logits [len(chunk), vocab] from an empty context."""
    out = Perplexity()
    for i, chunk in enumerate(chunks(tokens, n_ctx, bos_id, max_chunks)):
        out.add(nll(*scored(score(chunk), chunk)))
        if on_chunk is not None:
            on_chunk(i, out)
    return out


def text_tokens(tokenizer, text: str) -> tuple[list[int], int | None]:
    """(the text's tokens with BOS first where the vocabulary adds one, that BOS id or None)."""
    ids = tokenizer.encode(text, add_special_tokens=True)
    plain = tokenizer.encode(text[:64], add_special_tokens=False)
    head = tokenizer.encode(text[:64], add_special_tokens=True)
    bos = head[0] if len(head) == len(plain) + 1 else None
    return ids, bos
