"""The radix prefix tree against brute force: random sequences over a tiny alphabet (so
prefixes collide), admitted, computed in chunks, finished, preempted, evicted; after every
step the tree's invariants, the block reference counts recounted from scratch, the longest
match against every cached string, and the LRU choice of each eviction."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from freetoken.engine.block_manager import BlockManager
from freetoken.engine.prefix.checkpoint_policy import CheckpointPolicy
from freetoken.engine.prefix.cache import PrefixCache
from freetoken.engine.prefix.replay import PrefixReplay, StandInState
from freetoken.engine.sequence import Sequence
from freetoken.sampling_params import SamplingParams

BS = 2


def _strings(cache: PrefixCache) -> dict[tuple, object]:
    out = {}
    for node in cache._all_nodes():
        s, n = [], node
        while n is not cache.root:
            s[:0] = n.tokens
            n = n.parent
        out[tuple(s)] = node
    return out


def _lcp(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _recount(blocks: BlockManager, seqs) -> None:
    want = [0] * blocks.num_blocks
    for s in seqs:
        for b in s.block_table:
            want[b] += 1
        for src, _, _ in s.pending_copies:
            want[src] += 1
    for b in range(1, blocks.num_blocks):
        want[b] += blocks.cached[b]
    assert want[1:] == blocks.ref[1:]
    assert sorted(blocks.free) == [b for b in range(1, blocks.num_blocks) if want[b] == 0]


tokens = st.lists(st.integers(0, 2), min_size=1, max_size=14)
ops = st.lists(st.tuples(st.sampled_from(["start", "step", "finish", "reclaim", "match"]),
                         tokens, st.integers(0, 7)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(ops, st.booleans())
def test_tree_matches_brute_force(program, hybrid):
    blocks = BlockManager(14, BS)
    make_state = (lambda: StandInState(10)) if hybrid else None
    cache = PrefixCache(blocks, make_state=make_state, policy=CheckpointPolicy("end", per_session=3),
                        state_budget_bytes=60)
    running: list[Sequence] = []
    for n, (op, toks, k) in enumerate(program):
        before = _strings(cache)
        held_before = {s for s, nd in before.items() if blocks.ref[nd.block] > 1}
        if op == "start":
            seq = Sequence(f"s{n}", toks, SamplingParams(), None, 0)
            cache.admit(seq)
            assert seq.num_computed <= len(toks) - 1
            if blocks.blocks_needed(seq, len(toks)) > blocks.available:
                cache.undo_admit(seq)
                assert not seq.block_table and seq.num_computed == 0
            else:
                if hybrid and seq.num_computed:
                    assert seq.num_computed in {p for s in before.values() for p in s.checkpoints}
                if seq.state is None and hybrid:
                    seq.state = make_state()
                cache.copies_done(seq)
                running.append(seq)
        elif op == "step" and running:
            seq = running[k % len(running)]
            stop = cache.next_stop(seq) or len(seq)
            target = min(len(seq), stop, seq.num_computed + 1 + k)
            if blocks.blocks_needed(seq, target) <= blocks.available:
                blocks.allocate(seq, target)
                seq.num_computed = target
                cache.after_step(seq)
        elif op == "finish" and running:
            seq = running.pop(k % len(running))
            computed = seq.all_ids[:seq.num_computed]
            cache.release(seq)
            strings = _strings(cache)
            for j in range(BS, len(computed) + 1, BS):          # every computed full block is cached
                assert tuple(computed[:j]) in strings
            if computed:                                         # and the tail under some leaf
                assert any(s[:len(computed)] == tuple(computed) for s in strings)
        elif op == "reclaim":
            leaves = [nd for nd in before.values() if not nd.children and blocks.ref[nd.block] == 1]
            oldest = min((nd.last_access for nd in leaves), default=None)
            freed = cache.reclaim(1)
            gone = [s for s in before if s not in _strings(cache)]
            assert freed == len(gone) == (1 if leaves else 0)
            if gone:
                assert before[gone[0]].last_access == oldest
        elif op == "match":
            path, partial, m = cache.match(toks, len(toks))
            assert m == max([_lcp(toks, s) for s in before] + [0])
        removed = set(before) - set(_strings(cache))
        assert not removed & held_before, "an evicted prefix was still in use"
        if op not in ("reclaim", "start", "step"):
            assert not removed, "only eviction (asked for, or to make room) removes cached prefixes"
        cache.check()
        _recount(blocks, running)
        assert cache.checkpoint_bytes <= 60
    for seq in running:
        cache.release(seq)
    cache.reclaim(blocks.num_blocks)
    assert blocks.num_free == blocks.num_blocks - 1 and cache.num_nodes == 0 and cache.num_checkpoints == 0


def test_replay_reuses_history_token_exactly():
    r = PrefixReplay(block_size=16)
    hist = list(range(300))
    first = r.request(hist, list(range(1000, 1050)))
    assert first["cached_tokens"] == 0 and first["computed_tokens"] == 300
    second = r.request(hist + list(range(1000, 1050)) + list(range(2000, 2120)), [7])
    # everything but the last generated token (sampled, never run) comes from the tree
    assert second["cached_tokens"] == 349 and second["computed_tokens"] == 121


def test_hybrid_replay_resumes_from_checkpoints_and_respects_the_budget():
    r = PrefixReplay(block_size=16, state_bytes=1000, policy="end", state_checkpoints=4,
                     state_cache_gib=5000 / 2**30)
    hist = list(range(100))
    for turn in range(8):
        hist = hist + [5000 + 100 * turn + i for i in range(40)]
        out = [9000 + turn] * 5
        res = r.request(hist, out)
        if turn:
            assert res["cached_tokens"] == len(hist) - 41        # resumed at the end of the last request
        hist = hist + out
        assert r.prefix.checkpoint_bytes <= 5000
    r.prefix.check()


def test_edit_resumes_from_the_deepest_checkpoint_before_it():
    r = PrefixReplay(block_size=4, state_bytes=10, policy="end")
    a = list(range(50))
    r.request(a, [77, 78])
    edited = a[:20] + [999] + a[21:]
    res = r.request(edited, [1])
    assert res["cached_tokens"] == 0            # no checkpoint before position 20 ("end" policy)
    plain = PrefixReplay(block_size=4)
    plain.request(a, [77, 78])
    assert plain.request(edited, [1])["cached_tokens"] == 20
