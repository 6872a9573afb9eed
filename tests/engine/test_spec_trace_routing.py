"""Routing replayed from a trace (sim/trace_routing.py, the bench's `--routing-trace`): every
position routes to the trace's experts of decode step (position mod steps), a verify's union of
experts is the trace's union over those steps, speculative decoding stays exact under it, and
the shared Qwen3-30B-A3B trace reads into the table its raw CSV holds."""
from __future__ import annotations

import csv
import random
from pathlib import Path

import pytest
import torch

from freetoken import LLM
from freetoken.engine.spec.routing import moe_layers
from freetoken.experts.measure.trace_format import TraceWriter
from freetoken.sim.readers import load_trace
from freetoken.sim.trace import TraceError
from freetoken.sim.trace_routing import TraceRouting
from test_speculative import GREEDY, ForcedDrafter, force, generate, ids_for

TRACE_LAYERS, EXPERTS, TOP_K, STEPS = 7, 16, 4, 11
# ../shared beside the checkout (a worktree one level deeper finds it one more level up)
QWEN_TRACE = next((p / "shared" / "data" / "routing-traces" / "qwen3-30b-a3b" / "qwen.route.csv"
                   for p in Path(__file__).resolve().parents[2:5] if (p / "shared" / "data").is_dir()), Path("/none"))


def write_trace(path) -> list[list[list[int]]]:
    """A trace in the engine's own format: per decode step, per layer, TOP_K distinct ids (a
    prefill cell too, which routing must not use). Returns [step][layer] -> ids."""
    rng = random.Random(3)
    steps = [[rng.sample(range(EXPERTS), TOP_K) for _ in range(TRACE_LAYERS)] for _ in range(STEPS)]
    with TraceWriter(path, dict(num_layers=TRACE_LAYERS, num_experts=EXPERTS, top_k=TOP_K, model="t")) as w:
        for layer in range(TRACE_LAYERS):
            w.write("prefill", 0, layer, [[0, 1, 2, 3]] * 3)
        for s, per_layer in enumerate(steps):
            for layer, ids in enumerate(per_layer):
                w.write("decode", s + 1, layer, [ids])
    return steps


@pytest.fixture
def routed(tiny_dir, tmp_path):
    path = tiny_dir("qwen3_moe", layers=3, experts=EXPERTS, top_k=TOP_K)
    steps = write_trace(tmp_path / "t.jsonl")
    return path, load_trace(tmp_path / "t.jsonl"), steps


def test_each_position_routes_to_its_trace_step(routed):
    path, trace, steps = routed
    llm = LLM(str(path), dtype="float32", speculative="off")
    TraceRouting(trace, llm.engine.model).install()
    picked = [0, 3, 6]                               # 3 MoE layers over 7 trace layers, evenly
    seen = []
    for m in moe_layers(llm.engine.model):
        m.on_route = lambda layer, ids, w: seen.append((layer, ids.tolist()))
    prompt = ids_for(13, 1)
    llm.generate([prompt], GREEDY)
    rows = {layer: [] for layer in range(3)}
    for layer, ids in seen:
        rows[layer] += ids
    for layer in range(3):
        want = [sorted(steps[p % STEPS][picked[layer]]) for p in range(len(prompt) + GREEDY.max_tokens - 1)]
        assert [sorted(r) for r in rows[layer]] == want


def test_verify_union_is_the_traces_and_greedy_stays_exact(routed):
    path, trace, steps = routed
    prompts = [ids_for(20, s) for s in range(2)]
    plain = LLM(str(path), dtype="float32", speculative="off")
    TraceRouting(trace, plain.engine.model).install()
    ref = generate(plain, prompts, GREEDY)
    llm = LLM(str(path), dtype="float32")
    TraceRouting(trace, llm.engine.model).install()
    for mode in ("right", "half", "wrong"):
        force(llm, ForcedDrafter(prompts, ref, mode))
        assert generate(llm, prompts, GREEDY) == ref, mode
    # one verify of 5 positions: the distinct (layer, expert) pairs are the trace's union
    spec = force(llm, ForcedDrafter(prompts[:1], ref[:1], "right"))
    spec.K = 4
    spec.price.samples.clear()
    llm.generate(prompts[:1], GREEDY)
    p0 = len(prompts[0])
    union = sum(len({e for p in range(p0, p0 + 5) for e in steps[p % STEPS][l]}) for l in (0, 3, 6))
    # (the prompt is cached: its last token's one-row step comes first)
    assert next(u for n, u, _ in spec.price.samples if n == 5) == union


def test_wrong_shape_or_no_moe_is_one_clear_error(routed, tiny_dir):
    path, trace, _ = routed
    other = LLM(str(tiny_dir("qwen3_moe", layers=2, experts=8, top_k=2)), dtype="float32", speculative="off")
    with pytest.raises(TraceError, match="top-4 of 16 experts, the model top-2 of 8"):
        TraceRouting(trace, other.engine.model)
    dense = LLM(str(tiny_dir("qwen3")), dtype="float32", speculative="off")
    with pytest.raises(TraceError, match="no routed-expert layers"):
        TraceRouting(trace, dense.engine.model)


@pytest.mark.skipif(not QWEN_TRACE.exists(), reason="shared routing traces not present")
def test_real_qwen_trace_table_matches_its_csv():
    """The table for 5 layers, read independently from the CSV's rows (decode phase, slot order)."""
    from freetoken.sim.trace_routing import decode_table
    table = decode_table(load_trace(QWEN_TRACE), 5)
    raw: dict = {}
    with open(QWEN_TRACE) as f:
        for row in csv.reader(l for l in f if not l.startswith("#")):
            if row[0] == "turn" or row[1] != "1":
                continue
            raw.setdefault((int(row[2]), int(row[3])), {})[int(row[4])] = int(row[5])
    steps = sorted({s for s, _ in raw})
    layers = [0, 12, 24, 35, 47]                    # round(i * 47 / 4)
    want = [[[raw[(s, l)][k] for k in sorted(raw[(s, l)])] for l in layers] for s in steps]
    assert table.tolist() == want
    assert table.shape[2] == 6
    # a verify of 9 consecutive positions touches far fewer than 9 x 6 experts a layer
    u9 = torch.tensor([[len(set(table[s:s + 9, l].flatten().tolist())) for l in range(5)]
                       for s in range(len(table) - 9)]).float().mean()
    assert 15 < u9 < 35
