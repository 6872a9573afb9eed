"""Decode decisions on the device == the host planner (issue 23, item 1): the fixed-shape tensor
decision of `device_plan.DeviceLRU` and the host `decide` + `MissPlanner` + `SlotTable` under
lru, driven by the same routing, choose the same fills, victims and CPU sets and keep the same
residency. Replayed on the shared recorded traces (the simulator's readers) and on a trace the
engine records."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import SHARED_DATA
from tiered_helpers import one_torch_thread  # noqa: F401

from freetoken.experts.memory.decision import decide
from freetoken.experts.memory.device_plan import DeviceLRU
from freetoken.experts.memory.planner import MissPlanner
from freetoken.experts.memory.slots import SlotTable
from freetoken.sim.readers import load_trace
from freetoken.sim.trace import DECODE

TRACES = SHARED_DATA / "routing-traces"


def host_call(table, planner, flat, policy, b_p, b_h):
    """What TieredExperts does with the host planner for one layer call, copies landing at once."""
    uniq, counts = np.unique(flat, return_counts=True)
    d = decide(table, planner, uniq, counts,
               lambda mi, tok, _room: planner.plan(mi, tok, b_p, b_h, link_busy=False, policy=policy),
               admit=policy == "hybrid")
    if len(d.warm):
        table.assign(d.warm, d.warm_slots)
    fills, victims = [], []
    for ids, slots in d.waves():
        table.assign(ids, slots)
        table.ready(slots)
        table.unlock(slots)
        fills += ids.tolist()
        victims += slots.tolist()
    d.release()
    if len(d.warm):                         # lands before the next call (as the simulator does)
        table.ready(d.warm_slots)
        table.unlock(d.warm_slots)
    return fills, victims, sorted(d.cpu_ids.tolist()), d.warm.tolist()


def device_call(dev, flat, policy, b_p, b_h):
    dev.land()
    p = dev.plan(torch.from_numpy(flat), policy, b_p, b_h)
    n = int(p.fill_mask.sum())
    fills, victims = p.fill[:n].tolist(), p.victims[:n].tolist()
    cpu = sorted(p.uniq[p.on_cpu].tolist())
    warm = p.uniq[p.warm].tolist()
    got_cpu = sorted(set(p.cpu_ids[p.cpu_ids >= 0].tolist()))
    assert got_cpu == cpu                                 # the [T, K] list the CPU branch gets
    slot_ids = p.slot_ids.numpy()
    assert ((slot_ids >= 0) == np.isin(flat, cpu, invert=True)).all()   # every pair runs once
    return fills, victims, cpu, warm


def replay(calls, num_flat, slots, policy, b_p=6e9, b_h=1e10, policy_name="lru"):
    table = SlotTable(num_flat, calls[0][1], slots, policy_name)
    planner = MissPlanner(num_flat, policy)
    dev = DeviceLRU(num_flat, slots, torch.device("cpu"))
    dev.load(table, planner)
    n_fill = n_cpu = 0
    for i, (flat, _E, new_step) in enumerate(calls):
        if new_step:
            planner.end_step()
            dev.end_step()
        want = host_call(table, planner, flat, policy, b_p, b_h)
        got = device_call(dev, flat, policy, b_p, b_h)
        assert got == want, f"call {i}: device {got} != host {want}"
        n_fill += len(want[0]) + len(want[3])       # fills and background fills
        n_cpu += len(want[2])
    dev.check_against(table)
    back_t, back_p = SlotTable(num_flat, calls[0][1], slots, policy_name), MissPlanner(num_flat, policy)
    dev.store(back_t, back_p)
    assert np.array_equal(back_t.stamp, table.stamp) and np.array_equal(back_p.demand, planner.demand)
    return n_fill, n_cpu


def trace_calls(trace, max_calls=None, batch=1):
    """Decode cells as layer calls [T, K] of flat ids; `batch` consecutive tokens batched per call."""
    E = trace.num_experts
    cells = [c for c in trace.cells if c.phase == DECODE]
    calls, step = [], None
    by_step = {}
    for c in cells:
        by_step.setdefault(c.step, []).append(c)
    steps = sorted(by_step)
    for i in range(0, len(steps) - batch + 1, batch):
        group = [by_step[s] for s in steps[i:i + batch]]
        for layer_cells in zip(*group):
            rows = [r for c in layer_cells for r in c.rows]
            flat = np.asarray(rows, np.int64) + layer_cells[0].layer * E
            calls.append((flat, E, layer_cells[0].layer == min(c.layer for c in group[0])))
            if max_calls and len(calls) >= max_calls:
                return calls
    del step
    return calls


@pytest.mark.parametrize("trace_path,slot_frac", [("qwen3-30b-a3b/qwen.route.csv", 0.1),
                                                  ("qwen3-30b-a3b/qwen.route.csv", 0.3),
                                                  ("gpt-oss-120b/gptoss.route.csv", 0.1)])
@pytest.mark.parametrize("policy,bw", [("offload", (6e9, 1e10)), ("hybrid", (6e9, 1e10)),
                                       ("hybrid", (1e9, 3e10)), ("hybrid", (1e6, 1e10))])
@pytest.mark.parametrize("batch", [1, 3])
def test_device_decisions_equal_the_host_planner_on_real_traces(trace_path, slot_frac, policy, bw, batch):
    if not (TRACES / trace_path).is_file():
        pytest.skip(f"shared routing traces not found at {TRACES}")
    trace = load_trace(TRACES / trace_path)
    calls = trace_calls(trace, max_calls=600, batch=batch)
    num_flat = trace.num_layers * trace.num_experts
    slots = max(int(slot_frac * num_flat), calls[0][0].size + 1)
    n_fill, n_cpu = replay(calls, num_flat, slots, policy, *bw)
    assert n_fill > 0 and (n_cpu > 0) == (policy == "hybrid")


def test_device_decisions_equal_the_host_planner_on_an_engine_trace(tiny_dir, tmp_path):
    from freetoken import LLM
    from freetoken.sampling_params import SamplingParams
    model = tiny_dir("qwen3_moe", layers=2, experts=8, top_k=2)
    path = tmp_path / "routing.jsonl"
    llm = LLM(str(model), dtype="float32", moe_backend="cpu", record_routing=str(path), max_num_seqs=3,
              speculative="off")      # plain decode: 1..3 tokens a call, as the slot counts below assume
    try:
        llm.generate([list(range(5, 45)), list(range(50, 57)), list(range(3, 30, 2))],
                     SamplingParams(max_tokens=16, temperature=0.0))
    finally:
        llm.close()
    trace = load_trace(path)
    # the engine's own batched decode steps, as recorded (1..3 tokens per call)
    calls, last = [], None
    for c in trace.cells:
        if c.phase != DECODE:
            continue
        calls.append((np.asarray(c.rows, np.int64) + c.layer * trace.num_experts, trace.num_experts,
                      last is not None and c.layer <= last))
        last = c.layer
    assert len(calls) > 20
    for policy in ("offload", "hybrid"):
        for slots in (7, 12):
            replay(calls, 16, slots, policy, 6e9, 1e10)


def test_capacity_below_the_routed_pairs_is_refused():
    dev = DeviceLRU(16, 3, torch.device("cpu"))
    with pytest.raises(ValueError, match="capacity"):
        dev.plan(torch.tensor([[0, 1], [2, 3]]), "offload", 1.0, 2.0)
