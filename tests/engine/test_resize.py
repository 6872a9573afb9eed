"""Runtime resizing between engine steps: the expert cache, the KV pool and the checkpoint
budget halve and grow back while 4 streams decode, and every token equals the undisturbed
run's (greedy and seeded sampling); no KV block leaks, the prefix tree keeps its invariants."""
from __future__ import annotations

import random

import pytest

from freetoken import LLM, SamplingParams
from freetoken.errors import InvalidRequestError

GiB = 1 << 30


def prompts(n=4, seed=0):
    r = random.Random(seed)
    shared = [r.randrange(500) for _ in range(40)]
    return [shared + [r.randrange(500) for _ in range(10 + 7 * i)] for i in range(n)]


def check_blocks(engine):
    engine.blocks.check([s.block_table for s in engine.scheduler.running])
    engine.prefix.check()
    if hasattr(engine.model.experts, "cache"):
        engine.model.experts.cache.check()


def decode(engine, params, resize_every=0, cycle=(), scatter=False):
    """Run 4 streams to the end; every `resize_every` steps apply the next resize of `cycle`.
    `scatter`: hand out blocks in random order (outputs must not care), so a shrink has held
    blocks above the cut to move."""
    if scatter:
        random.Random(1).shuffle(engine.blocks.free)
    for i, p in enumerate(prompts()):
        engine.add_request(f"r{i}", p, params)
    toks = {f"r{i}": [] for i in range(4)}
    step, done = 0, []
    while engine.has_unfinished():
        if resize_every and step and step % resize_every == 0:
            done.append(engine.resize_memory(**cycle[len(done) % len(cycle)]))
            check_blocks(engine)
        for o in engine.step():
            toks[o.request_id].extend(o.new_token_ids)
        step += 1
    check_blocks(engine)
    return toks, done


@pytest.fixture(scope="module")
def model(tiny_dir):
    return str(tiny_dir("qwen3_moe", num_experts=8, num_experts_per_tok=2))


_made = []      # the engines `make` built, closed after each test (`close_engines`)


@pytest.fixture(autouse=True)
def close_engines():
    """Close every engine a test made: one left mid-decode held torch at one thread for every
    test after this file (the next engine's prefill then summed in another order)."""
    yield
    while _made:
        _made.pop().close()


def make(model, **kw):
    opts = dict(dtype="float32", moe_backend="offload", expert_cache_slots=8, kv_block_size=8,
                max_model_len=256, max_num_seqs=4, max_num_batched_tokens=64)
    opts.update(kw)
    _made.append(LLM(model, **opts).engine)
    return _made[-1]


@pytest.mark.parametrize("params", [SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True),
                                    SamplingParams(max_tokens=40, temperature=0.8, top_p=0.9, seed=7,
                                                   ignore_eos=True)], ids=["greedy", "seeded"])
def test_resize_cycles_under_load_equal_the_undisturbed_run(model, params):
    ref_engine = make(model)
    ref, _ = decode(ref_engine, params)
    engine = make(model)
    S = engine.model.experts.S
    kv = engine.runner.kv_nbytes / GiB
    full = {"expert_cache_gib": 8 * S / GiB, "kv_cache_gib": kv, "state_cache_gib": 1.0}
    half = {"expert_cache_gib": 4 * S / GiB, "kv_cache_gib": kv / 2, "state_cache_gib": 0.0}
    got, done = decode(engine, params, resize_every=3, cycle=[half, full], scatter=True)
    assert got == ref
    assert len(done) >= 6
    assert sum(d["components"]["kv_cache"]["moved_blocks"] for d in done) > 0
    shrunk = [d["components"] for d in done[::2]]
    assert all(c["expert_cache"]["slots_after"] == 4 for c in shrunk)
    assert any(c["kv_cache"]["blocks_after"] < c["kv_cache"]["blocks_before"] for c in shrunk)


def test_shrink_below_the_live_blocks_preempts_and_recomputes_identically(model):
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    ref, _ = decode(make(model), params)
    engine = make(model, max_model_len=136)                  # the pool keeps 18 blocks at least
    per_block = engine.runner.kv_nbytes / engine.blocks.num_blocks
    tight = {"kv_cache_gib": 12 * per_block / GiB}          # fewer blocks than 4 streams hold
    wide = {"kv_cache_gib": engine.runner.kv_nbytes / GiB}
    got, done = decode(engine, params, resize_every=5, cycle=[tight, wide], scatter=True)
    assert got == ref
    assert sum(d["components"]["kv_cache"]["preempted"] for d in done) > 0


def test_shrink_without_preemption_keeps_what_sequences_hold(model):
    engine = make(model)
    for i, p in enumerate(prompts()):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
    for _ in range(4):
        engine.step()
    held = engine.blocks.num_used - engine.blocks.reclaimable
    out = engine.resize_memory(kv_cache_gib=0.0, allow_preempt=False)["components"]["kv_cache"]
    assert out["preempted"] == 0 and out["clamped"]
    assert engine.blocks.num_blocks >= held + 1
    assert len(engine.scheduler.running) == 4
    check_blocks(engine)


def test_kv_shrink_gives_memory_back_and_grow_is_capped(model):
    engine = make(model)
    before = engine.runner.kv_nbytes
    per_block = before // engine.blocks.num_blocks
    engine.resize_memory(kv_cache_gib=before / 2 / GiB)
    assert engine.runner.kv_nbytes == engine.blocks.num_blocks * per_block <= before / 2
    assert all(c.k.shape[0] == engine.blocks.num_blocks * 8 for c in engine.runner.kv.values())
    out = engine.resize_memory(kv_cache_gib=0.0)["components"]["kv_cache"]
    assert "max_model_len" in out["clamped"] and engine.blocks.num_blocks == 256 // 8 + 1
    out = engine.resize_memory(kv_cache_gib=100.0)["components"]["kv_cache"]
    assert "capped" in out["clamped"] and engine.blocks.num_blocks == -(-4 * 256 // 8) + 1
    check_blocks(engine)


def test_state_budget_shrink_drops_oldest_checkpoints(tiny_dir):
    engine = LLM(str(tiny_dir("qwen3_next")), dtype="float32", kv_block_size=8, max_model_len=256).engine
    for i, p in enumerate(prompts()):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    n = engine.prefix.num_checkpoints
    assert n > 0
    out = engine.resize_memory(state_cache_gib=0.0)["components"]["state_cache"]
    assert out["dropped_checkpoints"] == n and engine.prefix.checkpoint_bytes == 0
    engine.prefix.check()


def test_bad_sizes_are_rejected_with_the_option_named(model):
    engine = make(model)
    with pytest.raises(InvalidRequestError, match="kv_cache_gib"):
        engine.resize_memory(kv_cache_gib=-1)
    with pytest.raises(InvalidRequestError, match="expert_cache_gib"):
        engine.resize_memory(expert_cache_gib="lots")


def test_a_recorded_backend_resizes_like_the_bare_one(model, tmp_path):
    """record_routing wraps the backend (experts/measure/recording.py): its cache is read and resized
    through the same Experts seam (cache_size, resize_cache_bytes) and the tokens equal the
    bare backend's."""
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    ref, _ = decode(make(model), params)
    engine = make(model, record_routing=str(tmp_path / "trace.jsonl"))
    cache = engine.memory_sizes()["expert_cache"]
    assert cache["slots"] == 8
    S = cache["bytes"] // 8
    cycle = [{"expert_cache_gib": 4 * S / GiB}, {"expert_cache_gib": 8 * S / GiB}]
    got, done = decode(engine, params, resize_every=3, cycle=cycle)
    assert got == ref
    assert [d["components"]["expert_cache"]["slots_after"] for d in done[:2]] == [4, 8]
    assert engine.memory_sizes()["expert_cache"]["bytes"] == done[-1]["components"]["expert_cache"]["after"]
