"""Where checkpoints go and which ones stay."""
from dataclasses import dataclass

import pytest
from hypothesis import given, strategies as st

from freetoken.engine.prefix.checkpoint_policy import CheckpointPolicy


class Marks:
    def __init__(self, positions):
        self.p = positions

    def positions(self, ids, start=0):
        return [p for p in self.p if p >= start and p <= len(ids)]


def test_cluster_keeps_the_anchor_right_before_the_content():
    pol = CheckpointPolicy(anchors=Marks([100, 103, 110, 400, 402]), min_gap=32)
    assert pol.plan(list(range(1000)), 0, 1000) == [110, 402, 1000]


def test_anchor_free_stretches_get_periodic_checkpoints():
    pol = CheckpointPolicy(anchors=Marks([5000]), period=2048)
    assert pol.plan(list(range(9000)), 0, 9000) == [2048, 4096, 5000, 7048, 9000]
    assert pol.plan(list(range(9000)), 4500, 9000) == [5000, 7048, 9000]      # only past the resume point


def test_llama_cpp_and_end_only_policies():
    ids = list(range(20000))
    assert CheckpointPolicy.llama_cpp().plan(ids, 0, 20000) == [8192, 16384, 20000]
    assert CheckpointPolicy("end", anchors=Marks([10, 500])).plan(ids, 0, 20000) == [20000]
    with pytest.raises(ValueError, match="policy"):
        CheckpointPolicy("sometimes")


@given(st.lists(st.integers(1, 5000), max_size=60), st.integers(0, 4000))
def test_plan_is_sorted_inside_the_prompt_and_ends_at_it(marks, start):
    pol = CheckpointPolicy(anchors=Marks(marks), period=700)
    plan = pol.plan(list(range(5000)), start, 5000)
    assert plan == sorted(set(plan)) and plan[-1] == 5000 and all(start < p <= 5000 for p in plan)
    gaps = [b - a for a, b in zip([start] + plan, plan)]
    assert max(gaps) <= 700                      # never a longer stretch without a checkpoint


@dataclass
class Cp:
    position: int
    hits: int = 0


def test_budget_keeps_the_newest_then_drops_unused_shallow_checkpoints_first():
    pol = CheckpointPolicy(per_session=4)
    on_path = [("n1", Cp(10, hits=2)), ("n2", Cp(20)), ("fork", Cp(30)), ("n4", Cp(40)),
               ("n5", Cp(50)), ("n6", Cp(60))]
    dropped = pol.to_drop(on_path, shared=lambda n: n == "fork")
    assert sorted(c.position for _, c in dropped) == [20, 40]          # 50, 60: the newest half
    everything_used = [(n, Cp(c.position, hits=1)) for n, c in on_path]
    assert sorted(c.position for _, c in pol.to_drop(everything_used, lambda n: False)) == [10, 20]
    assert pol.to_drop(on_path[:4], shared=lambda n: False) == []
