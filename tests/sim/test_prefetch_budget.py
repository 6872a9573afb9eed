"""Prefetch within a transfer budget ('+budget', experts/memory/prefetch_budget.py), replayed
through the engine's `SlotTable`: the copies, misses and used prefetches are counted here from
the stream and the table's `assign` calls, not from the budget's own counters."""
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken.experts.memory.prefetch_budget import RATIO
from freetoken.experts.measure.stats import tier_summary
from freetoken.experts.memory.slots import SlotTable, parse_policy_options
from freetoken.sim.access import stream_from_keys
from freetoken.sim.policies import POLICIES
from freetoken.sim.trace import PREFILL

from sim_strategies import layer_ordered_streams

BUDGETED = "lrfu+admit+layer+prefetch+budget"


def counted_replay(name: str, stream, slots: int):
    """Yield (copies, misses, prefetched hits) after every cell, counted outside the table."""
    p = POLICIES[name](slots, stream.num_layers, stream.num_experts)
    t = p.table
    n = Counter()
    guessed: set[int] = set()
    assign = t.assign

    def counted(ids, s):
        n["copies"] += len(ids)
        gone = assign(ids, s)
        guessed.difference_update(gone.tolist())
        return gone
    t.assign = counted
    p.place(Counter())
    for seg in stream.segments:
        for i, cell in enumerate(seg.cells):
            if seg.phase == PREFILL and seg.rows:
                p.prompt_rows(seg.layers[i], seg.rows[i])
            resident = {k for k in cell if t.slot_of[k] >= 0}
            n["used"] += len(resident & guessed)
            guessed.difference_update(cell)
            hits = p.prefill_cell(cell) if seg.phase == PREFILL else p.access_cell(cell)
            n["misses"] += len(cell) - int(np.sum(hits))
            if seg.phase != PREFILL:
                before = n["copies"]
                keys, victims = t.prefetch_after(np.asarray(cell, np.int64))
                if len(keys):
                    t.assign(keys, victims)
                    t.ready(victims)
                    t.unlock(victims)
                    guessed.update(keys.tolist())
                assert n["copies"] - before == len(keys)
            yield n["copies"], n["misses"], n["used"]


@settings(max_examples=150, deadline=None)
@given(stream=layer_ordered_streams(max_tokens=10), slots=st.integers(0, 9))
def test_copies_never_exceed_the_budget(stream, slots):
    """At every point: copies <= RATIO x (misses + hits a prefetch bought), prefill included."""
    for copies, misses, used in counted_replay(BUDGETED, stream, slots):
        assert copies <= RATIO * (misses + used) + 1e-9


def test_the_budget_prefetches_a_predictable_stream():
    """Every token routes expert t % 4 at each of 4 layers: 16 keys through 4 slots miss every
    time without guesses; the next layer's expert is the same id, which the budget affords."""
    L = E = 4
    cells = [[layer * E + t % E] for t in range(40) for layer in range(L)]
    stream = stream_from_keys(L, E, [("decode", cells)])
    *_, (_, plain, _) = counted_replay("lrfu+admit+layer", stream, 4)
    *_, (copies, budgeted, used) = counted_replay(BUDGETED, stream, 4)
    assert budgeted < plain / 2 and used > 0
    assert copies <= RATIO * (budgeted + used)


@pytest.mark.parametrize("name", ["lrfu+budget", "lrfu+admit+budget", "lrfu+prefetch+budget+admit"])
def test_budget_needs_prefetch(name):
    with pytest.raises(ValueError, match="budget"):
        parse_policy_options(name)


def test_the_budget_counts_reach_the_memory_summary():
    """/v1/memory's device cache (stats.tier_summary) carries the budget's counts."""
    t = SlotTable(8, 4, 2, BUDGETED)
    for ids in ([0, 1], [4, 5], [0, 1]):
        t.serve(np.array(ids), admission=False)
    stats = {"backend": "hybrid", "total": {}, "cache": {"slots": 2, **t.describe()}}
    cache = tier_summary(stats)["device_cache"]
    assert cache["policy"] == BUDGETED
    assert cache["transfers"] == 6 and cache["prefetch_used"] == 0          # three calls, two misses each
    assert cache["transfer_budget"] == round(RATIO * 6)
