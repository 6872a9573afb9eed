"""End to end through the engine: every backend and cache size gives the resident logits and
greedy tokens; routing traces and expert statistics are visible."""
import json

import pytest
import torch
from tiered_helpers import one_torch_thread  # noqa: F401

from freetoken import LLM
from freetoken.sampling_params import SamplingParams

PROMPT = list(range(5, 45))
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True) \
    if "ignore_eos" in SamplingParams.__dataclass_fields__ else SamplingParams(max_tokens=6, temperature=0.0)


def run(model, **opts):
    llm = LLM(str(model), dtype="float32", **opts)
    try:
        logits = llm.score(PROMPT)
        tokens = llm.generate([PROMPT, PROMPT[:7]], GREEDY)
        return logits, [c.token_ids for c in tokens], llm.expert_stats()
    finally:
        llm.close()


@pytest.fixture(scope="module")
def model(tiny_dir):
    return tiny_dir("qwen3_moe", layers=2, experts=8, top_k=2)


@pytest.fixture(scope="module")
def resident(model):
    return run(model, moe_backend="resident")


@pytest.mark.parametrize("backend,slots", [("offload", 0), ("offload", 3), ("offload", 16),
                                           ("hybrid", 0), ("hybrid", 1), ("hybrid", 8), ("hybrid", 16),
                                           ("cpu", None)])
def test_backend_matches_resident(model, resident, backend, slots):
    logits, tokens, stats = run(model, moe_backend=backend, expert_cache_slots=slots)
    torch.testing.assert_close(logits, resident[0], atol=1e-4, rtol=1e-4)
    assert tokens == resident[1]
    tot = stats["total"]
    assert tot["calls"] > 0 and tot["hits"] + tot["misses"] > 0
    if backend != "cpu":
        assert stats["cache"]["slots"] == slots and stats["cache"]["resident"] <= slots


def test_gpt_oss_mxfp4_hybrid(tiny_dir):
    m = tiny_dir("gpt_oss_mxfp4", layers=2, experts=8, top_k=2)
    ref = run(m, moe_backend="resident")
    got = run(m, moe_backend="hybrid", expert_cache_slots=5)
    torch.testing.assert_close(got[0], ref[0], atol=1e-4, rtol=1e-4)
    assert got[1] == ref[1]


def test_routing_trace_recording(model, tmp_path):
    path = tmp_path / "routing.jsonl"
    _, _, stats = run(model, moe_backend="hybrid", expert_cache_slots=4, record_routing=str(path))
    lines = [json.loads(s) for s in path.read_text().splitlines()]
    head, recs = lines[0], lines[1:]
    assert head["format"] == "freetoken-routing-trace" and head["num_experts"] == 8 and head["top_k"] == 2
    assert {r["phase"] for r in recs} == {"prefill", "decode"}
    assert {r["layer"] for r in recs} == {0, 1}
    assert all(len(row) == 2 for r in recs for row in r["experts"])
    assert stats["routing_trace"] == str(path)
