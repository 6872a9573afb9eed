"""The host cache's hit path (`acquire_hits`: one gather in `ready_of`, the policy told in a
batch at the next decision, issue 39) against the general path (`acquire`, the policy told at
once): over random layer calls and read-aheads, two caches driven alike end in the same
table -- residency, recency stamps, policy scores, pass and token counters, hit counts -- and
every slot the hit path hands out holds its expert's bytes, in an order the kernels may run
in one call only where the slots ascend with the ids."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken.experts.disk.host_cache import HostExpertCache

from test_host_cache import E, L, _acquire_all, _holds, _layout

calls = st.lists(st.tuples(st.sampled_from(["call", "call", "prefetch"]), st.integers(0, L - 1),
                           st.lists(st.lists(st.integers(0, E - 1), min_size=1, max_size=3, unique=True),
                                    min_size=1, max_size=2)),
                 min_size=1, max_size=30)


def _state(cache):
    t = cache.table
    return (t.slot_of.tolist(), t.owner.tolist(), t.stamp.tolist(), t.count.tolist(), t.since.tolist(),
            t.token, t.working_set, t._pass_count, cache.c["hits"], cache.c["prefetch_used"])


@settings(max_examples=60, deadline=None)
@given(ops=calls, slots=st.integers(1, L * E), policy=st.sampled_from(["lru", "lfu", "lrfu", "arc", "lrfu+layer"]))
def test_hit_path_leaves_the_table_the_general_path_leaves(tmp_path_factory, ops, slots, policy):
    lay, want = _layout(tmp_path_factory.mktemp("hh") / "f.bin")
    general, hits = HostExpertCache(lay, slots, policy, threads=2), HostExpertCache(lay, slots, policy, threads=2)
    try:
        for op, layer, rows in ops:
            k = min(len(r) for r in rows)
            flat = np.array([r[:k] for r in rows], np.int64) + layer * E
            uniq = np.unique(flat)
            if op == "prefetch":
                for c in (general, hits):
                    c.prefetch(uniq)
            else:
                _acquire_all(general, want, uniq)
                got = hits.acquire_hits(layer, uniq, flat)
                if got is None:
                    _acquire_all(hits, want, uniq)
                else:
                    s, ordered = got
                    _holds(hits, want, flat.ravel(), s.ravel())
                    su = hits.table.slot_of[uniq]
                    assert not ordered or (np.diff(su) > 0).all()
                    assert ordered or not hits.identity
                    hits.release(s)
            for c in (general, hits):
                c.drain()
                c.check()
            assert _state(general) == _state(hits)
    finally:
        general.close()
        hits.close()
