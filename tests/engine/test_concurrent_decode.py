"""Several sequences decoding together: the step groups their tokens per routed expert (each
expert's weights read once per step) and batches the dense GEMVs; every sequence must see the
logits it sees decoding alone."""
from __future__ import annotations

import pytest
import torch

from freetoken import LLM, SamplingParams

PROMPTS = [[5, 6, 7], list(range(10, 40)), [101, 3, 77, 9, 250, 14], list(range(200, 211))]


def _run(llm, prompts, steps):
    """Greedy decode of `prompts` in one engine batch; per sequence the tokens and each step's logits."""
    seen = {i: [] for i in range(len(prompts))}
    for i, p in enumerate(prompts):
        proc = (lambda i: lambda ids, lg: seen[i].append(lg.clone()) or lg)(i)
        llm.engine.add_request(f"r{i}", p, SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True,
                                                          logits_processors=[proc]))
    toks = {f"r{i}": [] for i in range(len(prompts))}
    while llm.engine.has_unfinished():
        for o in llm.engine.step():
            toks[o.request_id].extend(o.new_token_ids)
    return [(toks[f"r{i}"], torch.stack(seen[i])) for i in range(len(prompts))]


@pytest.mark.parametrize("fmt", [None, "int8"])
def test_grouped_decode_equals_per_sequence_decode(tiny_dir, fmt):
    opts = {"expert_format": fmt, "dense_format": fmt} if fmt else {}
    llm = LLM(str(tiny_dir("qwen3_moe", num_experts=8, num_experts_per_tok=4)), dtype="float32",
              moe_backend="cpu", **opts)
    together = _run(llm, PROMPTS, 12)
    for i, p in enumerate(PROMPTS):
        (alone_toks, alone_logits), = _run(llm, [p], 12)
        toks, logits = together[i]
        same = next((j for j, (a, b) in enumerate(zip(toks, alone_toks)) if a != b), len(toks))
        assert same >= 6, (i, toks, alone_toks)            # a flip needs a near-tie; none this early
        n = min(same + 1, len(logits))                      # logits agree up to the first differing token
        err = (logits[:n] - alone_logits[:n]).abs().max() / alone_logits[:n].abs().max()
        assert err < 1e-5, (i, float(err))
    llm.close()
