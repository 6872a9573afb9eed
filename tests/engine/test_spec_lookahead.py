"""Drafts as an expert lookahead: the experts a verify's tokens routed to before are copied into
the device or host cache ahead of their layer. Output is token for token the same with it on
and off (and plain decoding's) on every tier with a cache; the copies are counted used (routed
by the verify at that layer) or wasted, and reach /metrics."""
from __future__ import annotations

import numpy as np
import pytest

from freetoken import LLM
from freetoken.experts.memory.expected import ExpectedExperts

from test_speculative import GREEDY, ForcedDrafter, force, generate, ids_for


@pytest.mark.parametrize("tier", [dict(moe_backend="offload", expert_cache_slots=6),
                                  dict(moe_backend="hybrid", expert_cache_slots=5),
                                  dict(expert_tier="disk", host_cache_slots=6)])
def test_tokens_identical_with_lookahead_on_and_off(tiny_dir, tier):
    path = tiny_dir("qwen3_moe")
    prompts = [ids_for(20, 70 + s) for s in range(3)]
    ref = generate(LLM(str(path), dtype="float32", speculative="off", **tier), prompts, GREEDY)
    stats = {}
    for on in (True, False):
        llm = LLM(str(path), dtype="float32", spec_lookahead=on, **tier)
        for mode in ("right", "half", "right"):        # the first pass teaches the routing memory
            force(llm, ForcedDrafter(prompts, ref, mode))
            assert generate(llm, prompts, GREEDY) == ref, (tier, on, mode)
        stats[on] = llm.engine.expert_stats()
    la = stats[True]["speculative"]["lookahead"]
    assert la["known_positions"] > 0 and la["prefetched"] > 0
    assert la["used"] + la["wasted"] <= la["prefetched"] and la["used"] > 0
    assert stats[True]["spec_lookahead"]["prefetched"] == la["prefetched"]     # the backend's own counters
    assert "lookahead" not in stats[False]["speculative"]
    assert stats[False]["spec_lookahead"]["prefetched"] == 0


def test_lookahead_reaches_metrics(tiny_dir):
    from freetoken.server.operations.metrics import flatten
    path = tiny_dir("qwen3_moe")
    prompts = [ids_for(20, 90)]
    ref = generate(LLM(str(path), dtype="float32", speculative="off", moe_backend="offload",
                       expert_cache_slots=6), prompts, GREEDY)
    llm = LLM(str(path), dtype="float32", moe_backend="offload", expert_cache_slots=6)
    for _ in range(2):
        force(llm, ForcedDrafter(prompts, ref, "right"))
        generate(llm, prompts, GREEDY)
    names = {n for n, _ in flatten(llm.engine.expert_stats())}
    for field in ("prefetched", "used", "wasted", "hit_rate"):
        assert f"speculative_lookahead_{field}" in names and f"spec_lookahead_{field}" in names


def test_expected_experts_counts_used_and_wasted():
    e = ExpectedExperts()
    e.expect({0: np.array([3, 1, 3]), 1: np.array([2, 5])})
    assert list(e.take(0)) == [1, 3] and len(e.take(0)) == 0        # taken once
    e.started_for(0, np.array([1, 3]))
    e.started_for(1, np.array([2, 5]))
    e.settle(0, np.array([3, 4]))                                     # 3 used, 1 wasted
    assert e.stats()["used"] == 1 and e.stats()["wasted"] == 1
    e.expect(None)                                                    # layer 1 never ran: wasted
    s = e.stats()
    assert (s["prefetched"], s["used"], s["wasted"], s["steps"]) == (4, 1, 3, 1)
    assert s["hit_rate"] == 0.25


def test_no_lookahead_where_nothing_takes_hints(tiny_dir):
    """Backends without a cache (cpu, resident) and dense models: nothing is remembered."""
    for opts in (dict(moe_backend="cpu"), dict(moe_backend="resident")):
        llm = LLM(str(tiny_dir("qwen3_moe")), dtype="float32", **opts)
        assert llm.engine.spec.lookahead is None
    assert LLM(str(tiny_dir("qwen3")), dtype="float32").engine.spec.lookahead is None
