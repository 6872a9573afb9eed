"""Sampling: penalties, temperature, top-k, top-p, min-p, per-request seeded generators."""
from __future__ import annotations

import numpy as np
import torch

from ..errors import NumericalError
from ..kernels import cpu_kernels
from .sequence import Sequence


def _finite_rows(logits: torch.Tensor) -> torch.Tensor:
    """NaN -> -inf so one bad entry cannot win an argmax; a row with no number left means
    the model itself is broken, which no sampling setting can fix."""
    nan = torch.isnan(logits)
    if not nan.any():
        return logits
    if nan.all(dim=-1).any():
        raise NumericalError("the model produced NaN logits for every token (damaged weights "
                             "or an overflow): cannot sample")
    return logits.masked_fill(nan, float("-inf"))


def apply_penalties(logits: torch.Tensor, seq: Sequence) -> torch.Tensor:
    p = seq.params
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(seq.all_ids)), dtype=torch.long, device=logits.device)
        vals = logits[seen]
        logits[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and seq.counts:
        ids = torch.tensor(list(seq.counts), dtype=torch.long, device=logits.device)
        cnt = torch.tensor(list(seq.counts.values()), dtype=logits.dtype, device=logits.device)
        logits[ids] -= p.frequency_penalty * cnt + p.presence_penalty
    return logits


def distribution(logits: torch.Tensor, seq: Sequence) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(probabilities [V] the token is drawn from, or None when it is the argmax of the
    processed logits; those logits). Processors, penalties, temperature, top-k, top-p and
    min-p applied, as `sample_one` draws from them. logits [V] float32 (modified in place)."""
    p = seq.params
    for proc in p.logits_processors:
        logits = proc(seq.output_ids, logits)
    logits = _finite_rows(apply_penalties(logits, seq))
    if p.greedy:
        return None, logits
    raw = logits
    logits = logits / p.temperature
    if p.top_k and p.top_k < logits.shape[-1]:
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0, posinf=0.0, neginf=0.0)
    if p.top_p < 1.0:
        sorted_p, idx = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        drop = cum - sorted_p > p.top_p             # keep the smallest prefix reaching top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, idx, sorted_p)
    if p.min_p > 0.0:
        probs = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)
    if not float(probs.sum()) > 0.0:    # every candidate overflowed or was filtered out
        return None, raw
    return probs, raw


def sample_one(logits: torch.Tensor, seq: Sequence) -> int:
    """logits [V] float32 (modified in place)."""
    probs, processed = distribution(logits, seq)
    if probs is None:
        return int(torch.argmax(processed))
    return draw(probs, seq.generator)


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from probs [V] (not necessarily normalised) by inverse CDF on one uniform of the
    sequence's generator: one uniform per sampled position, so a speculative step that verifies
    drafted positions draws exactly the uniforms plain decoding would (spec/verify.py)."""
    u = float(torch.rand((), generator=generator, dtype=torch.float64))
    cdf = torch.cumsum(probs.detach().to("cpu", torch.float64), 0)
    i = int(torch.searchsorted(cdf, u * float(cdf[-1]), right=True))
    last = int(torch.nonzero(probs).max()) if i >= len(cdf) else i
    return min(i, last)


def plain_greedy(seqs: list[Sequence]) -> bool:
    """Whether one batched argmax samples them all (no processors, penalties or generators)."""
    return all(s.params.greedy and not s.params.logits_processors and s.params.repetition_penalty == 1.0
               and not s.params.presence_penalty and not s.params.frequency_penalty for s in seqs)


def greedy_tokens(logits: torch.Tensor) -> list[int]:
    """The argmax of each row [B, V] (NaN never wins). torch's argmax returns a NaN's index where
    a row has one, so one pass over the logits decides; only such rows take the NaN masking.
    CPU float32 rows go through numpy's argmax (the first maximum too, a NaN's index where there
    is one): three numpy calls instead of five torch ops, ~0.1 ms of a decode step on a medium
    model (issue 38); contiguous rows one C call a row (`ft_argmax`: -1 where the row has a NaN),
    ~0.1 ms less again."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2 and not logits.requires_grad:
        if logits.is_contiguous() and (lib := cpu_kernels()) is not None and hasattr(lib, "ft_argmax"):
            n, p = logits.shape[1], logits.data_ptr()
            best = [lib.ft_argmax(p + 4 * n * r, n) for r in range(logits.shape[0])]
            return best if -1 not in best else _finite_rows(logits).argmax(dim=-1).tolist()
        a = logits.numpy()
        best = a.argmax(axis=-1)
        if not np.isnan(a[np.arange(len(best)), best]).any():
            return best.tolist()
        return _finite_rows(logits).argmax(dim=-1).tolist()
    best = logits.argmax(dim=-1)
    if torch.isnan(logits.gather(-1, best.unsqueeze(-1))).any():
        best = _finite_rows(logits).argmax(dim=-1)
    return best.tolist()


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
    """logits [B, V] float32 -> one token per sequence."""
    if plain_greedy(seqs):
        return greedy_tokens(logits)
    return [sample_one(logits[i].clone(), s) for i, s in enumerate(seqs)]
