"""The verify price's measured prior (engine/verify_probe.py): a curve the probe timed prices the
sizes it never timed and the run never verified; the cache is keyed, re-measured when corrupt
or stale; the probe leaves no KV block or prefix-cache entry behind, and greedy output is
plain's with it on."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from freetoken import LLM, SamplingParams
from freetoken.engine import verify_probe as probe
from freetoken.engine.spec.price import VerifyPrice

# the 10-session dense replay's own cost per k, in plain steps (docs/benchmarks.md, spec34e's "M")
REPLAY = [1, 1.057, 1.087, 1.157, 1.244, 1.336, 1.494, 1.607, 1.775, 1.964, 2.047, 2.194, 2.426, 2.573,
          2.809, 2.848, 3.108]


def _priced(with_probe: bool, seed: int) -> VerifyPrice:
    """A price that saw the probe's steps (the replay's curve at the probe's sizes, measured at
    1.3x today's load, 2% noise) and then a free-running window: 1-3 positions only, at today's
    load, a few steps delayed."""
    rng = np.random.default_rng(seed)
    t1 = 0.018
    p = VerifyPrice(moe_layers=0, top_k=0, num_experts=0, expert_nbytes=0)
    if with_probe:      # listed as measure() lists them: the 1-position steps, then size by size
        p.set_probe([(n, 0, 1.3 * t1 * REPLAY[n - 1] * (1 + 0.02 * rng.standard_normal()))
                     for n in probe.SIZES for _ in range(probe.ROUNDS * (len(probe.SIZES) - 1 if n == 1 else 1))])
    for _ in range(200):
        n = int(rng.choice([1, 2, 3], p=[0.8, 0.15, 0.05]))
        t = t1 * REPLAY[n - 1] * (1 + 0.02 * rng.standard_normal())
        p.observe(n, 0, t + (rng.uniform(0.2, 1.0) * t1 if rng.random() < 0.03 else 0.0))
    return p


@pytest.mark.parametrize("seed", range(3))
def test_probe_prices_sizes_neither_it_nor_the_run_timed(seed):
    """The issue's "within 25%" on every k = 1..16, the 11 sizes the probe never timed (4, 6-8,
    10-16 positions: interpolated) and the run never verified (past 3) included: each within 10%
    of the curve, at today's load (not the probe's). Without the probe the price takes the line
    through the short verifies and is off by more than 25% at 17 positions (the bench read 0.44)."""
    p = _priced(True, seed)
    for n in range(1, 18):
        assert p.seconds(n, 0) == pytest.approx(0.018 * REPLAY[n - 1], rel=0.1), n
    cold = _priced(False, seed)
    assert cold.seconds(17, 0) < 0.75 * 0.018 * REPLAY[16]


def test_run_steps_correct_the_probe():
    """A size the run verifies often overrides the probe's factor for it (the probe measured 9
    positions 20% dearer than they run now): within 5% after 60 of its steps."""
    t1, rng = 0.018, np.random.default_rng(7)
    p = VerifyPrice(moe_layers=0, top_k=0, num_experts=0, expert_nbytes=0)
    p.set_probe([(n, 0, t1 * REPLAY[n - 1] * (1.2 if n == 9 else 1.0)) for n in probe.SIZES for _ in range(5)])
    for i in range(240):
        n = 9 if i % 4 == 0 else 1
        p.observe(n, 0, t1 * REPLAY[n - 1] * (1 + 0.01 * rng.standard_normal()))
    assert p.seconds(9, 0) == pytest.approx(t1 * REPLAY[8], rel=0.05)


@pytest.mark.parametrize("opts", [dict(expert_tier="disk", host_cache_slots=6),
                                  dict(moe_backend="offload", expert_cache_slots=8),
                                  dict(moe_backend="hybrid", expert_cache_slots=8)])
def test_backends_with_an_expert_cache_are_not_probed(tiny_dir, tmp_path, opts):
    """Their cache holds the sessions' experts: the probe's random tokens would fill it."""
    e = LLM(str(tiny_dir("qwen3_moe")), dtype="float32", spec_probe=False, **opts).engine
    hits = e.model.experts.stats()
    steps, why = probe.verify_curve(e, cache=tmp_path)
    assert steps is None and "cache" in why and not list(tmp_path.iterdir())
    assert e.model.experts.stats() == hits


def test_sizes_reach_the_longest_draft():
    assert probe.sizes_for(16) == (1, 2, 3, 5, 9, 17)
    assert probe.sizes_for(4) == (1, 2, 3, 5)
    assert probe.sizes_for(6) == (1, 2, 3, 5, 7)


@pytest.fixture
def engine_llm(tiny_dir):
    return LLM(str(tiny_dir("qwen3_moe")), dtype="float32", spec_probe=False)


def test_probe_leaves_no_kv_or_prefix_state_and_caches(engine_llm, tmp_path, monkeypatch):
    e = engine_llm.engine
    free, nodes = e.blocks.num_free, e.prefix.num_nodes
    calls = []
    real = probe.measure
    monkeypatch.setattr(probe, "measure", lambda *a, **k: calls.append(1) or real(*a, **k))
    steps, why = probe.verify_curve(e, cache=tmp_path)
    assert why == "measured" and len(calls) == 1
    sizes = probe.sizes_for(e.spec.K)
    assert sorted({n for n, _, _ in steps}) == list(sizes)
    per_round = 2 * (len(sizes) - 1)        # each size beside a 1-position forward
    assert len(steps) % per_round == 0 and probe.ROUNDS <= len(steps) // per_round <= 2 * probe.ROUNDS
    assert all(u > 0 and t > 0 for _, u, t in steps)        # a MoE: each step routed to experts
    assert e.blocks.num_free == free and e.prefix.num_nodes == nodes
    e.blocks.check([])
    e.prefix.check()
    again, why = probe.verify_curve(e, cache=tmp_path)
    assert why == "cached" and again == steps and len(calls) == 1
    (entry,) = list(tmp_path.iterdir())
    for bad in ("{not json", json.dumps({"format": probe.FORMAT, "measured_at": 0, "steps": steps}),
                json.dumps({"format": probe.FORMAT + 1, "measured_at": 1e12, "steps": steps}),
                json.dumps({"format": probe.FORMAT, "measured_at": 1e12, "steps": [[0, 0, -1.0]]})):
        entry.write_text(bad)             # corrupt, too old, another format, nonsense steps
        _, why = probe.verify_curve(e, cache=tmp_path)
        assert why == "measured"
    assert len(calls) == 5 and probe.read_entry(entry) is not None


def test_cache_is_keyed_by_model_and_options(tiny_dir, tmp_path):
    a = LLM(str(tiny_dir("qwen3_moe")), dtype="float32", spec_probe=False).engine
    b = LLM(str(tiny_dir("mixtral")), dtype="float32", spec_probe=False).engine
    c = LLM(str(tiny_dir("qwen3_moe")), dtype="float32", spec_probe=False, num_threads=1).engine
    for e in (a, b, c):
        assert probe.verify_curve(e, cache=tmp_path)[1] == "measured"
    assert len(os.listdir(tmp_path)) == 3


def test_measured_under_load_is_measured_again_when_quieter(tmp_path, monkeypatch):
    path = tmp_path / "e.json"
    probe.write_entry(str(path), [(1, 0, 0.01), (2, 0, 0.011)], load=3.0)
    monkeypatch.setattr(probe, "_load_per_core", lambda: 2.0)
    assert probe.read_entry(path) is not None
    monkeypatch.setattr(probe, "_load_per_core", lambda: 0.4)
    assert probe.read_entry(path) is None


@pytest.mark.verify_probe
def test_greedy_identity_with_the_probe_on(tiny_dir):
    """The probe at load (the engine's own, cached or not) leaves greedy output plain's; the
    price drafts from its first step."""
    path = str(tiny_dir("qwen3_moe"))
    prompts = [[(7 * i + 3 * s) % 300 + 5 for i in range(24)] for s in range(3)]
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    plain = [o.token_ids for o in LLM(path, dtype="float32", speculative="off").generate(prompts, greedy)]
    llm = LLM(path, dtype="float32", spec_probe=True)
    assert llm.engine.spec.price.probe is not None and llm.engine.spec.price.ready
    assert [o.token_ids for o in llm.generate(prompts, greedy)] == plain
    llm.engine.blocks.check([])
    llm.engine.prefix.check()
