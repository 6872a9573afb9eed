"""A decode row's MoE block as one call on reused rows (experts/execution/decode_row.py,
`SparseMoE.decode_row`, `ft_moe_row`): the tokens, every logits row and the expert counters
(per layer and per expert, counted in C) of the same call made through the MoE block's own path
(`CpuExperts.forward_logits`, which counts in Python); the model's last layer hands out a new
row each step (an MTP drafter keeps it), the others reuse theirs."""
from __future__ import annotations

import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.experts.execution.decode_row import MoERow
from freetoken.layers import moe as moe_mod
from freetoken.tiny import make_tiny


def _run(llm: LLM, prompts: list[list[int]], tokens: int):
    """(tokens of each prompt, every logits row, the expert counters) of a fresh greedy run."""
    model = llm.engine.model
    model.experts.stats_.reset()
    rows, orig = [], model.compute_logits
    model.compute_logits = lambda h: rows.append(orig(h).clone()) or rows[-1]
    try:
        out = llm.generate(prompts, SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True))
    finally:
        model.compute_logits = orig
    stats = model.experts.stats()
    assert model.experts.stats() == stats          # (a second read counts nothing twice)
    return [o.token_ids for o in out], rows, stats


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_decode_row_is_the_block_call(tmp_path, arch, dtype, stack_off):
    # (stack off: the layers one by one, so every one-row step calls MoERow; with the stack, a
    # prompt of <= 16 builds the attention halves (a few rows' call) and it takes every step)
    path = make_tiny(arch, tmp_path / arch, layers=3, hidden=64, experts=8, top_k=2, vocab=512)
    llm = LLM(str(path), dtype=dtype, moe_backend="cpu", num_threads=2, prefix_cache=False, speculative="off")
    calls = []
    orig = MoERow.__call__
    MoERow.__call__ = lambda self: calls.append(self.layer) or orig(self)
    try:
        for prompts in ([[5, 6, 7, 8, 9]], [[5, 6, 7, 8, 9], [11, 12]]):   # one row a step, then two (not taken)
            rows = _run(llm, prompts, 10)
            moe_mod.ROWS[0] = False
            try:
                ref = _run(llm, prompts, 10)
            finally:
                moe_mod.ROWS[0] = True
            assert rows[0] == ref[0]
            assert len(rows[1]) == len(ref[1]) and all(torch.equal(a, b) for a, b in zip(rows[1], ref[1]))
            assert rows[2]["per_expert"] == ref[2]["per_expert"]
            for a, b in zip(rows[2]["per_layer"], ref[2]["per_layer"]):
                assert {k: v for k, v in a.items() if not k.endswith("_s")} == \
                       {k: v for k, v in b.items() if not k.endswith("_s")}
    finally:
        MoERow.__call__ = orig
        llm.close()
    assert calls, arch


def test_last_layer_row_outlives_the_step(tmp_path, stack_off):
    """Each step's last hidden rows (`model.prenorm`, an MTP drafter's input) stay as they were
    after later steps; the interior layers' rows are reused (the layers called one by one: the
    stack's own call, tests/layers/test_decode_stack.py)."""
    path = make_tiny("qwen3_moe", tmp_path / "m", layers=3, hidden=64, experts=8, top_k=2, vocab=512)
    llm = LLM(str(path), dtype="float32", moe_backend="cpu", num_threads=2, prefix_cache=False, speculative="off")
    model = llm.engine.model
    kept, outs = [], {}
    forward, orig = model.forward, MoERow.__call__

    def spy(*a):
        h = forward(*a)
        kept.append((model.prenorm, model.prenorm.clone()))
        return h
    model.forward = spy
    MoERow.__call__ = lambda self: (lambda r: outs.setdefault(self.layer, set()).add(r.data_ptr()) or r)(orig(self))
    try:
        llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    finally:
        MoERow.__call__ = orig
        model.forward = forward
        llm.close()
    assert len(kept) >= 5 and all(torch.equal(a, b) for a, b in kept)
    assert len(outs[0]) == len(outs[1]) == 1          # interior layers: one row, reused
    assert len(outs[2]) > 1                           # the last: a new row each step
