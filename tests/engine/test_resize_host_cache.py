"""The disk tier's host cache resized between engine steps: 4 streams decode while it shrinks
to one slot per MoE layer (and to one slot) and grows back to the whole pool, and every token
equals the run with the pool in RAM (greedy and seeded sampling); over random resize sequences
too. Bad sizes are refused naming host_cache_gib; one under an expert is clamped to 1 slot."""
from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken import LLM, SamplingParams
from freetoken.errors import InvalidRequestError
from freetoken.loading.convert import convert

from test_resize import decode

GiB = 1 << 30
PARAMS = {"greedy": SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True),
          "seeded": SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True)}
OPTS = dict(dtype="float32", kv_block_size=8, max_model_len=256, max_num_seqs=4, max_num_batched_tokens=64,
            prefix_cache=False)


@pytest.fixture(scope="module")
def ftw(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("hcresize") / "m.ftw"
    convert(tiny_dir("qwen3_moe", num_experts=8, num_experts_per_tok=2), out, dtype="float32")
    return out


@functools.lru_cache(maxsize=None)
def reference(path: str, params: str):
    engine = LLM(path, **OPTS).engine                  # the pool in RAM
    assert engine.memory_sizes()["host_cache"] is None
    toks, _ = decode(engine, PARAMS[params])
    return toks


def disk_engine(path, slots):
    engine = LLM(str(path), host_cache_slots=slots, **OPTS).engine
    assert engine.settings.expert_tier == "disk"
    return engine


@pytest.mark.parametrize("params", list(PARAMS))
def test_shrink_and_grow_mid_generation_keep_every_token(ftw, params):
    engine = disk_engine(ftw, 8)
    hc = engine.memory_sizes()["host_cache"]
    S, L = hc["expert_bytes"], engine.model.pool.num_layers
    n = L * engine.model.pool.num_experts
    cycle = [{"host_cache_gib": L * S / GiB},           # one slot per MoE layer
             {"host_cache_gib": n * S / GiB},           # the whole pool
             {"host_cache_gib": 0.0},                   # under one expert: clamped to 1 slot
             {"host_cache_gib": 3 * S / GiB}]
    got, done = decode(engine, PARAMS[params], resize_every=2, cycle=cycle)
    assert got == reference(str(ftw), params)
    assert len(done) >= 8
    after = [d["components"]["host_cache"]["slots_after"] for d in done]
    assert after[:4] == [L, n, 1, 3]
    one = done[2]["components"]["host_cache"]
    assert "less than one expert" in one["clamped"] and one["after"] == S
    assert done[0]["components"]["host_cache"]["evicted"] > 0          # a shrink evicted residents
    hc = engine.memory_sizes()["host_cache"]
    assert hc["slots"] == after[-1] and hc["bytes"] == after[-1] * S
    assert engine.model.experts.stats()["host_cache"]["slots"] == after[-1]


@functools.lru_cache(maxsize=None)
def _shared(path: str):
    return disk_engine(path, 4)


@settings(max_examples=12, deadline=None)
@given(sizes=st.lists(st.integers(1, 24), min_size=1, max_size=6), every=st.integers(1, 4))
def test_random_resize_sequences_keep_every_token(ftw, sizes, every):
    engine = _shared(str(ftw))
    S = engine.memory_sizes()["host_cache"]["expert_bytes"]
    got, done = decode(engine, PARAMS["greedy"], resize_every=every,
                       cycle=[{"host_cache_gib": s * S / GiB} for s in sizes])
    assert got == reference(str(ftw), "greedy")
    n = engine.model.pool.num_layers * engine.model.pool.num_experts
    for d, want in zip(done, sizes * len(done)):
        assert d["components"]["host_cache"]["slots_after"] == min(want, n)      # capped at the pool


def test_bad_sizes_are_refused_naming_the_option(ftw):
    engine = disk_engine(ftw, 4)
    for bad in (-1, "lots", float("nan"), True):
        with pytest.raises(InvalidRequestError, match="host_cache_gib"):
            engine.resize_memory(host_cache_gib=bad)
    with pytest.raises(InvalidRequestError, match="more than this machine's memory"):
        engine.resize_memory(host_cache_gib=1e6)
    assert engine.memory_sizes()["host_cache"]["slots"] == 4       # nothing changed
    n = engine.model.pool.num_layers * engine.model.pool.num_experts
    out = engine.resize_memory(host_cache_gib=0.5)["components"]["host_cache"]
    assert "whole pool" in out["clamped"] and out["slots_after"] == n


def test_engines_without_a_disk_tier_have_no_host_cache(tiny_dir):
    engine = LLM(str(tiny_dir("qwen3_moe")), dtype="float32", max_model_len=128).engine
    assert engine.memory_sizes()["host_cache"] is None
    assert engine.resize_memory(host_cache_gib=1.0)["components"]["host_cache"] is None


def test_a_recorded_disk_tier_resizes_like_the_bare_one(ftw, tmp_path):
    """record_routing wraps the disk tier (experts/measure/recording.py): its host cache is read and
    resized through the same Experts seam (host_cache_size, resize_host_cache_bytes), with the
    bare tier's sizes and the in-RAM pool's tokens."""
    engine = LLM(str(ftw), host_cache_slots=8, record_routing=str(tmp_path / "trace.jsonl"), **OPTS).engine
    assert engine.settings.expert_tier == "disk"
    hc = engine.memory_sizes()["host_cache"]
    assert hc == disk_engine(ftw, 8).memory_sizes()["host_cache"]
    S, L = hc["expert_bytes"], engine.model.pool.num_layers
    cycle = [{"host_cache_gib": L * S / GiB}, {"host_cache_gib": 0.0}, {"host_cache_gib": 8 * S / GiB}]
    got, done = decode(engine, PARAMS["greedy"], resize_every=2, cycle=cycle)
    assert got == reference(str(ftw), "greedy")
    assert [d["components"]["host_cache"]["slots_after"] for d in done[:3]] == [L, 1, 8]
    assert engine.memory_sizes()["host_cache"]["slots"] == done[-1]["components"]["host_cache"]["slots_after"]
    engine.close()                                              # flushes the trace
    assert len((tmp_path / "trace.jsonl").read_text().splitlines()) > 1     # the recorder saw the routing
