"""The host cache's hit path (`acquire_hits`: one gather in `ready_of`, the policy told in a
batch at the next decision, issue 39) against the general path (`acquire`, the policy told at
once): over random layer calls and read-aheads, two caches driven alike end in the same
table -- residency, recency stamps, policy scores, pass and token counters, hit counts -- and
every slot the hit path hands out holds its expert's bytes, in an order the kernels may run
in one call only where the slots ascend with the ids; with numpy and each C build of the hit
path's lock (kernels/c/host_hits.c), each distinct slot locked once while held."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken import kernels
from freetoken.experts.disk.c_hits import HitCalls
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


@pytest.mark.parametrize("build", [None, *kernels.variants_here()])
@settings(max_examples=60, deadline=None)
@given(ops=calls, slots=st.integers(1, L * E), policy=st.sampled_from(["lru", "lfu", "lrfu", "arc", "lrfu+layer"]))
def test_hit_path_leaves_the_table_the_general_path_leaves(tmp_path_factory, build, ops, slots, policy):
    lay, want = _layout(tmp_path_factory.mktemp("hh") / "f.bin")
    general, hits = HostExpertCache(lay, slots, policy, threads=2), HostExpertCache(lay, slots, policy, threads=2)
    hits.hits_c = HitCalls.of(build)
    assert (hits.hits_c is None) == (build is None)
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
                    s, ordered, held = got
                    _holds(hits, want, flat.ravel(), s.ravel())
                    su = hits.table.slot_of[uniq]
                    assert not ordered or (np.diff(su) > 0).all()
                    assert ordered or not hits.identity
                    locked = np.zeros(hits.capacity, np.int32)
                    locked[np.unique(s)] = 1            # (no read in flight here: nothing else holds a lock)
                    assert np.array_equal(hits.table.locks, locked)
                    hits.release_hits(held)
                    assert not hits.table.locks.any()
            for c in (general, hits):
                c.drain()
                c.check()
            assert _state(general) == _state(hits)
    finally:
        general.close()
        hits.close()


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_ranked_kernel_sums_slots_in_the_pools_order(fmt):
    """The C kernel over the experts moved to other slots, told each slot's flat id as its rank
    (`CpuExpertExecutor.run(rank=...)`, what the disk tier runs at any cache layout), gives the
    resident pool's answer bit for bit: same experts, summed in the same order."""
    import torch
    from test_cpu_kernels import make_banks

    from freetoken.experts.execution.cpu import CpuExpertExecutor
    gen = torch.Generator().manual_seed(3)
    n, hidden, inter = 12, 128, 64
    banks = make_banks(fmt, n, hidden, inter, False, gen)
    perm = torch.randperm(n, generator=gen)                   # expert f sits in slot perm[f]
    slots = {k: torch.empty_like(v) for k, v in banks.items()}
    for k, v in banks.items():
        slots[k][perm] = v
    pool, moved = (CpuExpertExecutor(b, fmt, hidden, inter, gemm_tokens=0) for b in (banks, slots))
    try:
        for t in (1, 3):
            ids = torch.stack([torch.randperm(n, generator=gen)[:6] for _ in range(t)])
            x, w = torch.randn(t, hidden, generator=gen), torch.rand(t, 6, generator=gen)
            want = pool.run(x, ids, w)
            assert torch.equal(moved.run(x, perm[ids], w, rank=ids), want)
    finally:
        pool.close()
        moved.close()


_PAIR_BANKS: dict = {}


@settings(max_examples=25, deadline=None)
@given(fmt=st.sampled_from(["bf16", "int8", "fp32"]), isa=st.sampled_from(["native", "portable"]),
       tokens=st.sampled_from([1, 2, 5, 17]), bias=st.booleans(), data=st.data())
def test_pairs_landed_in_any_order_sum_as_one_ranked_call(fmt, isa, tokens, bias, data):
    """What the disk tier runs while reads are in flight (backend `_run_as_landed`): the
    call's experts split into groups that land in any order, each group's pair outputs kept
    apart (`run_pairs`), then added in rank order (`combine`): the one ranked call's answer
    bit for bit (bf16 on native also through the GEMM tiles: their groups of >= 4 tokens),
    with the experts in shuffled slots."""
    import torch
    from test_cpu_kernels import make_banks

    from freetoken import kernels
    from freetoken.experts.execution.cpu import CpuExpertExecutor
    from freetoken.kernels.gemm import mode_code, modes_here
    n, hidden, inter, k = 10, 96, 64, 4
    key = (fmt, isa, bias)
    if key not in _PAIR_BANKS:
        gen = torch.Generator().manual_seed(5)
        _PAIR_BANKS[key] = CpuExpertExecutor(make_banks(fmt, n, hidden, inter, bias, gen), fmt, hidden, inter,
                                             gemm_tokens=0, isa=isa)
    ex = _PAIR_BANKS[key]
    seed = data.draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(n, generator=gen)[:k] for _ in range(tokens)])
    rank = (ids * 7 + 3) % n                      # slot f holds the expert ranked (7f + 3) mod n
    x, w = torch.randn(tokens, hidden, generator=gen), torch.rand(tokens, k, generator=gen)
    group = torch.tensor(data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))   # landing batch of each slot
    order = data.draw(st.permutations([0, 1, 2]))
    lib = kernels.load(isa)
    tiles = fmt == "bf16" and isa == "native" and data.draw(st.booleans())
    if tiles:
        lib.ft_set_gemm(mode_code(lib, data.draw(st.sampled_from(modes_here(lib)))), 1, 0)
    try:
        want = ex.run(x, ids, w, rank=rank)
        y = torch.full((tokens * k, hidden), -0.0)
        for g in order:
            ex.run_pairs(x, torch.where(group[ids] == g, ids, -1), y)
        out = torch.zeros(tokens, hidden)
        ex.combine(ids, rank, w, y, out)
    finally:
        if tiles:
            lib.ft_set_gemm(0, 16, 0)
    assert torch.equal(out, want)


@pytest.mark.parametrize("build", kernels.variants_here())
@settings(max_examples=80, deadline=None)
@given(rows=st.integers(1, 40), k=st.integers(1, 8), off=st.integers(0, 5000), data=st.data())
def test_routed_ids_in_c_are_numpys(build, rows, k, off, data):
    """The C call that keys a layer call's routed ids (`HitCalls.route`, what `DiskExperts.forward`
    takes on the top-k tensor): flat = ids + off as numpy adds them, the distinct ones ascending as
    a sorted set, repeats included (forced routes) and both sorts (<= 64 ids and more)."""
    import torch
    ids = torch.tensor(data.draw(st.lists(st.integers(0, 127), min_size=rows * k, max_size=rows * k)),
                       dtype=torch.int64).reshape(rows, k)
    flat, uniq = HitCalls.of(build).route(ids.data_ptr(), rows, k, off)
    assert np.array_equal(flat, ids.numpy() + off)
    assert uniq.tolist() == sorted(set((ids.numpy() + off).ravel().tolist()))
