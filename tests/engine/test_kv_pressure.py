"""Short KV does not thrash (issue #15, defect 3): requests that together need a little more
KV than there is are admitted whole-prompt with growth room, so at most one preemption per
extra request happens (not one per step), and each greedy output equals the request alone."""
from __future__ import annotations

import random

import pytest

from freetoken import LLM, SamplingParams


def _llm(d, capacity_tokens: int) -> LLM:
    probe = LLM(d, dtype="float32", kv_cache_gib=0.001)
    per_token = probe.engine.runner.kv_nbytes / (probe.engine.blocks.num_blocks * 16)
    probe.close()
    tokens = capacity_tokens // 16 * 16 - 0.5                # whole 16-token blocks
    return LLM(d, dtype="float32", kv_cache_gib=tokens * per_token / 2**30, max_num_seqs=8)


def _run(llm, prompts, gen):
    params = SamplingParams(max_tokens=gen, temperature=0.0, ignore_eos=True)
    before = llm.engine.scheduler.num_preemptions
    outs = [c.token_ids for c in llm.generate(prompts, params)]
    return outs, llm.engine.scheduler.num_preemptions - before


@pytest.mark.parametrize("n,kv_for", [(2, 2 / 1.01), (3, 2.05)])
def test_short_kv_neither_thrashes_nor_changes_outputs(tiny_dir, n, kv_for):
    d = str(tiny_dir("qwen3_moe"))
    prompt, gen = 150, 30
    rng = random.Random(n)
    prompts = [[rng.randrange(3, 500) for _ in range(prompt)] for _ in range(n)]
    llm = _llm(d, int(kv_for * (prompt + gen)))
    assert llm.engine.capacity_tokens < n * (prompt + gen)          # they cannot all fit at once
    together, preemptions = _run(llm, prompts, gen)
    llm.close()
    alone_llm = _llm(d, int(kv_for * (prompt + gen)))
    alone = [_run(alone_llm, [p], gen)[0][0] for p in prompts]
    alone_llm.close()
    assert together == alone
    assert preemptions <= n - 1, f"{preemptions} preemptions: the scheduler thrashes"
