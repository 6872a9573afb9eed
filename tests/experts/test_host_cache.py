"""The host expert cache against a reference model (a dict of what each expert's bytes are):
any sequence of acquires, releases and prefetches, from several threads at once, leaves the
table consistent (no slot lost or duplicated), every locked slot holding exactly its
expert's bytes from the file; a file shrunk while serving fails only the experts it lost."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken.experts.disk.pieces import BankLayout, DiskLayout, Piece
from freetoken.experts.disk.host_cache import ExpertReadError, HostExpertCache
from freetoken.experts.memory.pool import ExpertSpec

L, E, ROW = 3, 6, 48          # 18 experts; gate_up = 2 pieces of 32 bytes each side of a gap, down = 48


def _layout(path, n=L * E):
    """A file with two banks per expert in scattered places (pieces not in expert order)."""
    rng = np.random.default_rng(0)
    order = rng.permutation(3 * n)                # where each of the 3n pieces lies
    data = rng.integers(0, 256, 3 * n * ROW, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    off = order.reshape(3, n).astype(np.int64) * ROW
    z = np.zeros(n, np.int32)
    banks = {"gate_up": BankLayout(torch.uint8, (2 * ROW,), [Piece(z, off[0], ROW, 0), Piece(z, off[1], ROW, ROW)]),
             "down": BankLayout(torch.uint8, (ROW,), [Piece(z, off[2], ROW, 0)])}
    want = {f: {"gate_up": np.concatenate([data[off[0, f]:off[0, f] + ROW], data[off[1, f]:off[1, f] + ROW]]),
                "down": data[off[2, f]:off[2, f] + ROW]} for f in range(n)}
    lay = DiskLayout([path], banks, L, E, ExpertSpec(8, 8), {"down_types": torch.arange(n, dtype=torch.int32)[:, None]})
    return lay, want


def _holds(cache, want, flats, slots):
    for f, s in zip(flats.tolist(), slots.tolist()):
        for k in ("gate_up", "down"):
            assert np.array_equal(cache.banks[k][s].numpy(), want[f][k]), (f, s, k)
        assert int(cache.banks["down_types"][s, 0]) == f


def _acquire_all(cache, want, ids):
    """Acquire `ids` in as many rounds as the free slots allow, checking each round's bytes."""
    rest = ids
    while len(rest):
        n, got = cache.acquire(rest)
        assert 1 <= n <= len(rest) and len(set(got.tolist())) == n
        _holds(cache, want, rest[:n], got)
        cache.release(got)
        rest = rest[n:]


ops = st.lists(st.tuples(st.sampled_from(["acquire", "prefetch"]),
                         st.lists(st.integers(0, L * E - 1), min_size=1, max_size=8, unique=True)),
               min_size=1, max_size=25)


@settings(max_examples=40)
@given(ops=ops, slots=st.integers(1, 9), policy=st.sampled_from(["lru", "lfu", "lrfu", "arc"]))
def test_matches_reference_single_thread(tmp_path_factory, ops, slots, policy):
    lay, want = _layout(tmp_path_factory.mktemp("hc") / "f.bin")
    cache = HostExpertCache(lay, slots, policy, threads=3)
    try:
        for op, ids in ops:
            ids = np.array(sorted(ids), np.int64)
            if op == "prefetch":
                cache.prefetch(ids)
                continue
            _acquire_all(cache, want, ids)
            cache.check()
        cache.drain()
        cache.check()
        res = np.flatnonzero(cache.table.slot_of >= 0)
        _holds(cache, want, res, cache.table.slot_of[res])    # every resident slot holds its expert
        assert (cache.table.locks == 0).all()
    finally:
        cache.close()


@settings(max_examples=15)
@given(seed=st.integers(0, 10**6), slots=st.integers(4, 12))
def test_concurrent_readers_lose_and_duplicate_nothing(tmp_path_factory, seed, slots):
    lay, want = _layout(tmp_path_factory.mktemp("hc") / "f.bin")
    cache = HostExpertCache(lay, slots, "lrfu", threads=4)
    errors = []

    def worker(k):
        rng = np.random.default_rng(seed + k)
        try:
            for _ in range(30):
                ids = np.unique(rng.integers(0, L * E, rng.integers(1, 4)))
                if rng.random() < 0.3:
                    cache.prefetch(ids)
                    continue
                rest = ids
                while len(rest):
                    n, got = cache.acquire(rest)
                    _holds(cache, want, rest[:n], got)
                    cache.release(got)
                    rest = rest[n:]
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors[0]
        cache.drain()
        cache.check()
        assert (cache.table.locks == 0).all()
        res = np.flatnonzero(cache.table.slot_of >= 0)
        assert len(res) == cache.resident <= slots
        _holds(cache, want, res, cache.table.slot_of[res])
    finally:
        cache.close()


def test_shrunk_file_fails_only_the_lost_experts(tmp_path):
    lay, want = _layout(tmp_path / "f.bin")
    cache = HostExpertCache(lay, 4, "lru", threads=2)
    try:
        pieces = [*lay.banks["gate_up"].pieces, *lay.banks["down"].pieces]
        end = np.max([pc.offsets + ROW for pc in pieces], axis=0)    # each expert's last byte
        lost = int(np.argmax(end))                   # the expert owning the file's last piece
        os.truncate(lay.paths[0], int(end[lost]) - 1)
        with pytest.raises(ExpertReadError, match=f"truncated: expert {lost % E} of MoE layer {lost // E}"):
            cache.acquire(np.array([lost]))
        cache.check()
        ok = next(f for f in range(L * E) if int(end[f]) < int(end[lost]) - ROW)
        n, got = cache.acquire(np.array([ok]))        # the others are still served
        _holds(cache, want, np.array([ok]), got)
        cache.release(got)
        assert cache.stats()["read_errors"] == 1 and (cache.table.locks == 0).all()
    finally:
        cache.close()


@settings(max_examples=30, deadline=None)
@given(calls=st.lists(st.lists(st.integers(0, L * E - 1), min_size=1, max_size=6, unique=True), min_size=1, max_size=8),
       ahead=st.lists(st.integers(0, L * E - 1), max_size=6, unique=True))
def test_room_for_the_whole_pool_puts_each_expert_in_its_own_slot(tmp_path_factory, calls, ahead):
    """A cache that can hold the whole pool reads expert f into slot f, whatever order the calls
    and read-aheads come in, so every call's slots ascend with its ids (one kernel call)."""
    lay, want = _layout(tmp_path_factory.mktemp("pool") / "experts.bin")
    cache = HostExpertCache(lay, L * E + 2, threads=2)
    try:
        for ids in calls:
            _acquire_all(cache, want, np.sort(np.asarray(ids, np.int64)))
            cache.prefetch(np.asarray(ahead, np.int64))
        cache.drain()
        cache.check()
        res = np.flatnonzero(cache.table.slot_of >= 0)
        assert (cache.table.slot_of[res] == res).all()
    finally:
        cache.close()
