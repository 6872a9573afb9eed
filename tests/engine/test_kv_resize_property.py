"""KV pool resizing against a model-free reference (hypothesis): a fake runner stores, per
block, the token ids whose K/V the block holds; after any interleaving of admissions, steps,
finishes and resizes, every running sequence's block table and every prefix-tree node still
read back exactly their tokens, and the block manager and tree invariants hold."""
from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken.engine.block_manager import BlockManager
from freetoken.engine.kv_resize import resize_kv
from freetoken.engine.prefix.cache import PrefixCache
from freetoken.engine.scheduler import Scheduler
from freetoken.engine.sequence import Sequence, Status
from freetoken.sampling_params import SamplingParams

BS = 4


class RowsRunner:
    """block -> list of token ids (the "K/V rows") it holds."""

    def __init__(self, num_blocks):
        self.rows = {b: [None] * BS for b in range(num_blocks)}

    def resize_kv(self, num_blocks, moves):
        for b, d in moves.items():
            self.rows[d] = list(self.rows[b])
        self.rows = {b: self.rows.get(b, [None] * BS) for b in range(num_blocks)}

    def run(self, batch):
        for seq, n in batch:
            for src, dst, k in seq.pending_copies:
                self.rows[dst][:k] = self.rows[src][:k]
            for p in range(seq.num_computed, seq.num_computed + n):
                self.rows[seq.block_table[p // BS]][p % BS] = seq.all_ids[p]


def make(num_blocks):
    blocks = BlockManager(num_blocks, BS)
    prefix = PrefixCache(blocks)
    sched = Scheduler(blocks, 3, 16, prefix)
    return SimpleNamespace(blocks=blocks, prefix=prefix, scheduler=sched, runner=RowsRunner(num_blocks),
                           settings=SimpleNamespace(max_num_seqs=3), max_model_len=64, capacity_tokens=0)


def step(eng):
    batch = eng.scheduler.schedule()
    eng.runner.run(batch)
    for seq, n in batch:
        eng.prefix.copies_done(seq)
        seq.num_computed += n
        eng.prefix.after_step(seq)
        if seq.num_pending == 0:
            seq.append(seq.all_ids[-1] % 7 + 1)            # a deterministic "sample"
            if len(seq.output_ids) >= seq.params.max_tokens:
                eng.scheduler.finish(seq, "length")


def check(eng):
    eng.blocks.check([s.block_table for s in eng.scheduler.running])
    eng.prefix.check()
    rows = eng.runner.rows
    for seq in eng.scheduler.running:
        for p in range(seq.num_computed):
            assert rows[seq.block_table[p // BS]][p % BS] == seq.all_ids[p], (seq.request_id, p)
    for node in eng.prefix._all_nodes():
        assert tuple(rows[node.block][:len(node.tokens)]) == node.tokens


ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.lists(st.integers(1, 3), min_size=1, max_size=14), st.integers(1, 6)),
    st.tuples(st.just("step"), st.integers(1, 4), st.just(0)),
    st.tuples(st.just("resize"), st.integers(2, 40), st.booleans())), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_resizes_keep_every_block_reading_back_its_tokens(script):
    eng = make(24)
    seqs = []
    for op, a, b in script:
        if op == "add":
            seq = Sequence(f"r{len(seqs)}", a, SamplingParams(max_tokens=b), None, 0)
            seqs.append(seq)
            eng.scheduler.add(seq)
        elif op == "step":
            for _ in range(a):
                step(eng)
        else:
            before = eng.blocks.num_blocks
            r = resize_kv(eng, a, allow_preempt=b)
            assert r.blocks_after == eng.blocks.num_blocks == len(eng.runner.rows)
            if a < before and not r.clamped:
                assert eng.blocks.num_blocks == a
        check(eng)
    for _ in range(200):                 # everything still finishes, with the tokens it would have
        if not eng.scheduler.has_unfinished():
            break
        step(eng)
        check(eng)
    assert all(s.status is Status.FINISHED for s in seqs)
    assert eng.blocks.num_used == eng.prefix.num_nodes          # no block held by anyone else
