"""Rendering sessions to tokens, the prefix-only ideal (against a brute-force reference)
and `freetoken sim sessions` end to end on tiny checkpoints and real sessions."""
from __future__ import annotations

import json

import pytest
from helpers import SHARED_DATA
from hypothesis import given, settings
from hypothesis import strategies as st
from session_fixtures import mini_swe_agent

from freetoken.server.chat import render
from freetoken.sim.sessions import read_sessions
from freetoken.sim.sessions.model_state import cache_shapes
from freetoken.sim.sessions.tokens import Turn, prefix_ideal, render_session
from freetoken.tokenizer import Tokenizer

DATA = SHARED_DATA / "agent-sessions"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"agent sessions not found at {DATA}")


def brute_ideal(turns):
    out = []
    for i, t in enumerate(turns):
        best = 0
        for u in turns[:i]:
            seq = u.prompt_ids + u.output_ids
            k = 0
            while k < min(len(seq), len(t.prompt_ids)) and seq[k] == t.prompt_ids[k]:
                k += 1
            best = max(best, k)
        out.append(len(t.prompt_ids) - best)
    return out


seqs = st.lists(st.integers(0, 3), min_size=0, max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(seqs, seqs), min_size=1, max_size=6))
def test_prefix_ideal_matches_brute_force(pairs):
    turns = [Turn(p, o) for p, o in pairs]
    assert prefix_ideal(turns) == brute_ideal(turns)


def test_rendering_matches_the_server_and_continues(tiny_dir, tmp_path):
    tok = Tokenizer(tiny_dir("qwen3_moe"))
    [s] = read_sessions([mini_swe_agent(tmp_path / "demo.traj.json")])
    turns = render_session(tok, s)
    for req, t in zip(s.requests, turns):
        assert t.prompt_ids == tok.encode(render(tok, req.messages, req.tools))
    # the output is what the template writes for the response; it ends at the end token
    assert tok.decode(turns[0].output_ids).startswith("<think>\nlist files first\n</think>")
    assert tok.decode(turns[0].output_ids).endswith("<|im_end|>")
    # mini-swe-agent never re-sends reasoning: the next prompt diverges where thinking was
    nxt = turns[1].prompt_ids
    full = turns[0].prompt_ids + turns[0].output_ids
    assert nxt[:len(turns[0].prompt_ids)] == turns[0].prompt_ids and nxt[:len(full)] != full


def test_cache_shapes_match_the_models_own_state(tiny_dir):
    from freetoken import LLM
    for arch in ("qwen3_5_moe", "gpt_oss", "qwen3_moe"):
        d = tiny_dir(arch)
        model = LLM(str(d), dtype="float32").engine.model
        state = model.make_state()
        assert cache_shapes(d, "float32")["state_bytes"] == (state.nbytes if state is not None else 0), arch


def run_json(run_sim, *argv):
    code, out, err = run_sim("sessions", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


@needs_data
def test_sim_sessions_full_attention_reaches_the_ideal(run_sim, tiny_dir, tmp_path):
    runs = json.loads((DATA / "tau-bench_gpt-4o-airline" / "gpt-4o-airline.json").read_text())
    tau = tmp_path / "tau.json"
    tau.write_text(json.dumps(runs[:6]))
    rep = run_json(run_sim, "--model", str(tiny_dir("qwen3_moe")), "--sessions", str(tau))
    assert rep["kind"] == "full attention" and len(rep["sessions"]) == 6
    t = rep["total"]
    for p in ("anchors", "periodic", "end"):
        assert t["policies"][p]["computed"] == t["policies"]["anchors"]["computed"]
        assert t["policies"][p]["worst_ratio"] <= 1.02
    assert t["ideal"] < t["prompt_tokens"] / 3


@needs_data
def test_sim_sessions_hybrid_anchors_beat_periodic_on_edited_histories(run_sim, tiny_dir):
    traj = DATA / "swe-agent-1.0.1_selfhosted-lastn5" / "sympy__sympy-21612.traj"
    rep = run_json(run_sim, "--model", str(tiny_dir("qwen3_5_moe")), "--sessions", str(traj),
                   "--state-checkpoints", "16")
    [row] = rep["sessions"]
    assert rep["kind"] == "hybrid" and row["requests"] == 14
    pol = row["policies"]
    # the target for hybrid models; anchors must also beat the other policies
    assert pol["anchors"]["ratio"] <= 1.05
    assert pol["periodic"]["ratio"] > pol["anchors"]["ratio"] + 0.1
    assert pol["end"]["ratio"] > pol["anchors"]["ratio"] + 0.1
    assert pol["anchors"]["cached"] + pol["anchors"]["computed"] == row["prompt_tokens"]


def test_sim_sessions_table_and_bad_input(run_sim, tiny_dir, tmp_path):
    traj = mini_swe_agent(tmp_path / "demo.traj.json")
    code, out, err = run_sim("sessions", "--model", str(tiny_dir("qwen3_moe")), "--sessions", str(traj))
    assert code == 0
    assert "demo-1" in out and "TOTAL" in out and "anchors re-prefill" in out
    code, out, err = run_sim("sessions", "--model", str(tiny_dir("qwen3_moe")), "--sessions", str(tmp_path / "x"))
    assert code == 2 and err.strip().endswith("x: no such file or folder") and len(err.strip().splitlines()) == 1
    code, out, err = run_sim("sessions", "--model", str(tmp_path), "--sessions", str(traj))
    assert code == 2 and "config.json" in err
    code, out, err = run_sim("sessions", "--model", str(tiny_dir("qwen3_moe")), "--sessions", str(traj),
                             "--policies", "lru")
    assert code == 2 and "--policies" in err


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_5_moe"])
def test_sim_sessions_kv_pool_is_the_engines(tiny_dir, arch):
    """--kv-cache-gib gives the replay the KV blocks the engine's memory plan allocates for that
    kv_cache_gib (null block included), so both have the same usable blocks."""
    from freetoken import LLM
    from freetoken.config import EngineConfig
    from freetoken.engine.prefix.replay import PrefixReplay
    from freetoken.memory.resolve import resolve
    from freetoken.memory.probe import MachineMemory
    from freetoken.sim.sessions.cli import kv_blocks

    d, bs = tiny_dir(arch), 16
    per_token = cache_shapes(d, "float32")["kv_bytes_per_token"]
    big = MachineMemory(host_total=2**36, host_available=2**35, host_source="test")
    for tokens in (100, 1000, 4096, 5001):           # the GiB of that many tokens, whole blocks or not
        gib = tokens * per_token / 2**30
        cfg = EngineConfig(model=str(d), dtype="float32", device="cpu", kv_cache_gib=gib, kv_block_size=bs,
                           max_model_len=64, max_num_seqs=256)
        plan = resolve(cfg, machine=big).plan
        assert plan.kv_blocks and kv_blocks(gib, per_token, bs) == plan.kv_blocks, (arch, tokens)
        replay = PrefixReplay(block_size=bs, num_blocks=kv_blocks(gib, per_token, bs))
        assert replay.blocks.num_usable == plan.kv_blocks - 1
    engine = LLM(str(d), dtype="float32", device="cpu", kv_cache_gib=gib, kv_block_size=bs, max_model_len=64,
                 max_num_seqs=256).engine
    try:
        assert engine.kv_usage().usable == replay.blocks.num_usable
    finally:
        engine.close()
