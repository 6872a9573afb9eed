"""Readers on the real shared traces: counts as documented in routing-traces/SOURCES.md."""

from collections import Counter

import pytest

from freetoken.sim.readers import load_trace
from freetoken.sim.trace import DECODE, PREFILL

MIXTRAL = "mixtral-8x7b-instruct-fp8"


def phase_counts(trace):
    return Counter(c.phase for c in trace.cells), Counter(m[1] for m in trace.missing)


def test_vllm_raw_prefill_and_decode_with_dropped_records(traces_dir):
    t = load_trace(traces_dir / MIXTRAL / "routing_raw.jsonl")
    assert (t.num_layers, t.num_experts, t.top_k) == (32, 8, 2)
    cells, missing = phase_counts(t)
    assert cells == {PREFILL: 4320 - 122, DECODE: 2656 - 77}
    assert missing == {PREFILL: 122, DECODE: 77}
    assert {c.step for c in t.cells if c.phase == PREFILL} == set(range(135))
    assert {c.step for c in t.cells if c.phase == DECODE} == set(range(135, 135 + 83))
    assert t.decode_tokens() == 83


def test_vllm_post_processed_file_holds_the_raw_runs_decode_records(traces_dir):
    raw = load_trace(traces_dir / MIXTRAL / "routing_raw.jsonl")
    post = load_trace(traces_dir / MIXTRAL / "humaneval_routing.jsonl")
    as_multiset = lambda t: Counter((c.layer, c.rows) for c in t.cells if c.phase == DECODE)  # noqa: E731
    assert as_multiset(raw) == as_multiset(post)
    assert len(post.missing) == 77 and post.decode_tokens() == 83


@pytest.mark.parametrize(
    "name, per_seq",
    [("gsm8k_2_routing.jsonl", [(168, 5366, 10), (79, 2523, 5)]), ("humaneval_2_routing.jsonl", [(83, 2648, 8), (255, 8131, 29)])],
)
def test_vllm_per_layer_counter_files(traces_dir, name, per_seq):
    t = load_trace(traces_dir / MIXTRAL / name)
    for seq, (steps, records, missing) in enumerate(per_seq):
        assert len({c.step for c in t.cells if c.seq == seq}) == steps
        assert sum(1 for c in t.cells if c.seq == seq) == records
        assert sum(1 for m in t.missing if m[0] == seq) == missing
    assert any("alignment" in n for n in t.notes)


@pytest.mark.parametrize(
    "path, shape, prompt, decode, rows",
    [
        ("qwen3-30b-a3b/qwen.route.csv", (48, 128, 6), 28, 128, 44766),
        ("gpt-oss-120b/gptoss.route.csv", (36, 128, 2), 85, 64, 10560),
    ],
)
def test_route_trace_csv(traces_dir, path, shape, prompt, decode, rows):
    t = load_trace(traces_dir / path)
    L = shape[0]
    assert (t.num_layers, t.num_experts, t.top_k) == shape
    assert sum(len(r) for c in t.cells for r in c.rows) == rows
    assert all(len(c.rows[0]) == t.top_k for c in t.cells)
    assert len({c.step for c in t.cells if c.phase == PREFILL}) == prompt
    assert t.decode_tokens() == decode and not t.missing
    # llama.cpp evaluates the last layer only for the last prompt token
    assert sum(1 for c in t.cells if c.phase == PREFILL) == prompt * (L - 1) + 1
    assert len(t.expert_bytes) == L and all(b > 0 for b in t.expert_bytes)
    decode_order = [(c.step, c.layer) for c in t.cells if c.phase == DECODE]
    assert decode_order == sorted(decode_order)


def test_flame_folder_pt_and_csv_agree(traces_dir):
    folder = traces_dir / "flame-moe-290m"
    t = load_trace(folder)
    assert (t.num_layers, t.num_experts, t.top_k) == (8, 64, 6)
    assert t.decode_tokens() == 2048 and len(t.cells) == 2048 * 8
    for csv in sorted(folder.glob("*layer[27]_*.csv")):
        pt = csv.with_suffix(".pt")
        assert [c.rows for c in load_trace(csv).cells] == [c.rows for c in load_trace(pt).cells]
