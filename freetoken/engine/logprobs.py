"""Log-probabilities of tokens, as the OpenAI API reports them (`logprobs`, `top_logprobs`,
`echo`): log_softmax of the target model's raw logits in float32, before any logits
processor, penalty, temperature or top-k/top-p (OpenAI and vLLM's default report the
model's distribution, not the sampling one). A grammar-constrained or penalised token
thus gets the logprob the model gave it; speculative decoding does not change it, since
the rows are the target model's. Ties in the top-k go to the smaller token id."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float                          # -inf stays -inf here; the API layer writes it out
    top: list[tuple[int, float]]            # the k most likely tokens, most likely first


def _top(x: torch.Tensor, lp: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs, ids) of the k largest logits per row, ordered on the logits (log_softmax
    can round two different logits to one value); equal logits by ascending id."""
    ids = torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k]
    return lp.gather(-1, ids), ids


def token_logprobs(logits: torch.Tensor, token_id: int, k: int) -> TokenLogprob:
    """The logprob of `token_id` under one row of raw logits [V], and the top k."""
    return rows_logprobs(logits.reshape(1, -1), [token_id], k)[0]


def rows_logprobs(logits: torch.Tensor, token_ids: list[int], k: int) -> list[TokenLogprob]:
    """Row i of logits [N, V] scores token_ids[i]."""
    x = logits.float()
    x = x.masked_fill(torch.isnan(x), float("-inf"))      # a NaN entry is no probability, not all NaN
    lp = torch.log_softmax(x, dim=-1).nan_to_num(nan=float("-inf"), neginf=float("-inf"))
    ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1, 1)
    chosen = lp.gather(1, ids).squeeze(1).tolist()
    if k > 0:
        vals, top_ids = _top(x, lp, min(k, lp.shape[-1]))
        tops = [list(zip(i, v)) for i, v in zip(top_ids.tolist(), vals.tolist())]
    else:
        tops = [[] for _ in token_ids]
    return [TokenLogprob(t, c, top) for t, c, top in zip(token_ids, chosen, tops)]


def prompt_logprobs(prompt_logits: torch.Tensor, prompt_ids: list[int], k: int,
                    chunk: int = 256) -> list[TokenLogprob | None]:
    """Logprobs of each prompt token given the ones before it: row j of prompt_logits
    [P, V] predicts token j+1. The first token has none (None), as in OpenAI's `echo`."""
    out: list[TokenLogprob | None] = [None]
    for a in range(0, len(prompt_ids) - 1, chunk):      # bounded float32 copies of [chunk, V]
        b = min(a + chunk, len(prompt_ids) - 1)
        out += rows_logprobs(prompt_logits[a:b], prompt_ids[a + 1:b + 1], k)
    return out
