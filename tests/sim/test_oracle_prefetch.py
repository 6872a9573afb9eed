"""`default+oracle-prefetch` (the default with a perfect next-layer guess): every guess is an
expert the next cell routes, so each is used and none is wasted, and its copies stay within the
default's transfer budget (counted outside the table: hits and fills from the replay)."""
from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken.experts.memory.prefetch_budget import RATIO
from freetoken.sim.policies import POLICIES
from freetoken.sim.replay import replay_hits
from sim_strategies import layer_ordered_streams


@settings(max_examples=80, deadline=None)
@given(stream=layer_ordered_streams(), slots=st.integers(0, 9))
def test_perfect_guesses_are_all_used_and_stay_in_budget(stream, slots):
    p = POLICIES["default+oracle-prefetch"](slots, stream.num_layers, stream.num_experts)
    hits = replay_hits(p, stream)
    b, t = p.table.budget, p.table
    assert b.wasted == 0 and b.used == t.prefetches
    misses = sum(not h for _, h in hits)
    assert b.misses == misses
    assert p.transfers <= RATIO * (misses + t.prefetches) + 1e-9
