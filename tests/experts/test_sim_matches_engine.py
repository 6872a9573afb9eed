"""`freetoken sim` replays the engine's own cache: a recorded engine trace, replayed through
the simulator's projection, gives the engine's hit and miss counts exactly."""
import pytest
from tiered_helpers import one_torch_thread  # noqa: F401

from freetoken import LLM
from freetoken.experts.measure.bandwidth import BandwidthEstimator
from freetoken.experts.memory.transfer import PacedCopyEngine, SyncCopyEngine
from freetoken.sampling_params import SamplingParams
from freetoken.sim.access import build_stream
from freetoken.sim.hardware import Hardware
from freetoken.sim.projection import planner_rates, project
from freetoken.sim.readers import load_trace

def _land_prefetches_at_once(llm, policy):
    """The simulator lands a prefetch before the next layer runs; the engine's threaded copies
    may still be in flight then (the expert runs on the CPU): copy synchronously to compare."""
    if "+prefetch" in policy:
        llm.engine.model.experts.inner.cache.copy = SyncCopyEngine()


PROMPTS = [list(range(5, 45)), list(range(50, 57)), list(range(3, 30, 2))]
HW = Hardware("test", link_gbps=10, cpu_gbps=20, link_concurrent_gbps=10, cpu_concurrent_gbps=20, device_gbps=100)


@pytest.mark.parametrize("policy", ["lru", "lfu", "lrfu", "lrfu+admit", "arc", "lru+prefetch", "lrfu+admit+prefetch",
                                    "lru+layer", "lrfu+admit+layer+prefetch", "lrfu+admit+layer+prefetch+budget",
                                    "lrfu+prompt", "lrfu+admit+layer+prefetch+budget+prompt",
                                    "lrfu+admit+layer+prefetch+budget+prompt+path"])
def test_engine_and_sim_count_the_same_misses(tiny_dir, tmp_path, policy):
    model = tiny_dir("qwen3_moe", layers=2, experts=8, top_k=2)
    path = tmp_path / "routing.jsonl"
    slots = 5               # under two layers of experts: no whole-layer prefill streaming
    llm = LLM(str(model), dtype="float32", moe_backend="offload", expert_cache_slots=slots,
              expert_cache_policy=policy, record_routing=str(path), max_num_seqs=2)
    try:
        _land_prefetches_at_once(llm, policy)
        llm.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0.0))
        tot = llm.expert_stats()["total"]
    finally:
        llm.close()
    stream = build_stream(load_trace(str(path)), in_order=True)
    p = project(stream, 1, HW, slots, "all-fill", [1.0] * 2, [0.0] * 2, cache_policy=policy)
    assert p.hits + p.prefill_hits == tot["hits"]
    assert p.fills + p.cpu + p.prefill_misses == tot["misses"]
    assert p.fills + p.prefill_misses == tot["fills"]
    assert p.prefetches == tot["prefetches"] and (p.prefetches > 0) == ("+prefetch" in policy)


def test_offload_waits_for_prefetches_in_flight(tiny_dir, tmp_path):
    """`offload` with the default's prefetch on a slow threaded link (3 ms an expert): a layer
    call waits for the copies in flight, so no expert runs on the CPU and the engine counts what
    the simulator (prefetches landed in time) counts."""
    policy = "lrfu+admit+layer+prefetch+budget"
    model = tiny_dir("qwen3_moe", layers=2, experts=8, top_k=2)
    path = tmp_path / "routing.jsonl"
    llm = LLM(str(model), dtype="float32", moe_backend="offload", expert_cache_slots=5,
              expert_cache_policy=policy, record_routing=str(path), max_num_seqs=2)
    try:
        inner = llm.engine.model.experts.inner
        inner.cache.copy = PacedCopyEngine(inner.pool.expert_nbytes / 0.003)
        llm.generate(PROMPTS, SamplingParams(max_tokens=6, temperature=0.0))
        tot = llm.expert_stats()["total"]
    finally:
        llm.close()
    stream = build_stream(load_trace(str(path)), in_order=True)
    p = project(stream, 1, HW, 5, "all-fill", [1.0] * 2, [0.0] * 2, cache_policy=policy)
    assert tot["cpu_experts"] == 0 and p.prefetches == tot["prefetches"] > 0
    assert p.hits + p.prefill_hits == tot["hits"]
    assert p.fills + p.prefill_misses == tot["fills"]


# hybrid: B_P / B_H = 6 / (6 + 4) = 0.6 gives q* >= 1 for every m >= 1, so no background
# (timing-dependent) fills
HYBRID_HW = Hardware("test", link_gbps=6, cpu_gbps=10, link_concurrent_gbps=6, cpu_concurrent_gbps=4,
                     device_gbps=100)


@pytest.mark.parametrize("policy", ["lru", "lrfu+admit", "arc+admit", "lrfu+admit+prefetch", "lrfu+admit+layer+prefetch",
                                    "lrfu+admit+layer+prefetch+budget", "lrfu+admit+layer+prefetch+budget+prompt",
                                    "lrfu+admit+layer+prefetch+budget+prompt+path"])
def test_hybrid_engine_and_sim_split_the_same_misses(tiny_dir, tmp_path, policy):
    """The q* split with fixed bandwidths (no online estimates, no split guard) is deterministic:
    the engine and the simulator fill and run on the CPU the same experts."""
    model = tiny_dir("qwen3_moe", layers=2, experts=8, top_k=2)
    path = tmp_path / "routing.jsonl"
    slots = 5
    llm = LLM(str(model), dtype="float32", moe_backend="hybrid", expert_cache_slots=slots,
              expert_cache_policy=policy, record_routing=str(path), max_num_seqs=2)
    try:
        tiered = llm.engine.model.experts.inner          # under the routing recorder
        b_p, b_h = planner_rates(HYBRID_HW)              # the one meaning of B_H both sides use
        tiered.est = BandwidthEstimator(b_p * 1e9, b_h * 1e9, online=False)
        tiered.guard = None
        _land_prefetches_at_once(llm, policy)
        llm.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0.0))
        tot = llm.expert_stats()["total"]
    finally:
        llm.close()
    assert tot["cpu_experts"] > 0 and tot["warm_fills"] == 0
    stream = build_stream(load_trace(str(path)), in_order=True)
    p = project(stream, 1, HYBRID_HW, slots, "q*", [1.0] * 2, [0.0] * 2, cache_policy=policy)
    assert p.hits + p.prefill_hits == tot["hits"]
    assert p.fills + p.cpu + p.prefill_misses == tot["misses"]
    assert p.fills + p.prefill_misses == tot["fills"]
    assert p.cpu == tot["cpu_experts"]
    assert p.prefetches == tot["prefetches"] and (p.prefetches > 0) == ("+prefetch" in policy)
