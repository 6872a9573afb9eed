"""Growing and shrinking the paged KV pool between engine steps.

The K/V tensors are one preallocated tensor per layer, indexed by block id. Shrinking gives
memory back by *compaction*: the pool is cut at `n` blocks, every held block with an id >= n
moves to a free id below n (its rows are copied, block tables and tree nodes are remapped),
and each layer's tensor is reallocated at the new size. Chunked allocation was the other
choice; it would put a chunk lookup in every attention gather, every step, to save a copy
that only a resize pays (a few ms per GiB, measured by bench/resize.py).

Before anything moves, the pool makes room in this order:
  1. evict prefix-tree blocks no sequence holds (LRU leaves first);
  2. preempt running sequences, newest first (`allow_preempt`): each publishes what it has
     computed to the prefix tree and resumes later from there, or recomputes it if those
     blocks had to go too. Sampling continues from the sequence's own generator, so outputs
     do not change.
The pool never shrinks below `min_blocks`: one max_model_len sequence, the floor the start-up
plan keeps too (so a request the engine took at start is never refused later, and a preempted
one can always resume); without preemption, not below what sequences hold.
Growing appends free blocks; a grow beyond `max_blocks` (what max_num_seqs x max_model_len
can use) is capped.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class KVResize:
    blocks_before: int
    blocks_after: int
    evicted_blocks: int = 0        # prefix-tree blocks dropped for room
    preempted: int = 0             # running sequences preempted for room
    moved_blocks: int = 0          # held blocks copied below the cut
    clamped: str = ""              # why fewer blocks than asked went away / were added


def resize_kv(engine, num_blocks: int, *, allow_preempt: bool = True) -> KVResize:
    blocks, prefix, sched, runner = engine.blocks, engine.prefix, engine.scheduler, engine.runner
    old = blocks.num_blocks
    res = KVResize(old, old)
    lo, hi = min_blocks(engine), max_blocks(engine)
    if num_blocks > hi:
        num_blocks, res.clamped = hi, f"capped at {hi} blocks (max_num_seqs x max_model_len)"
    if num_blocks < lo:
        num_blocks, res.clamped = lo, f"kept {lo} blocks: one max_model_len sequence must fit"
    if num_blocks > old:
        runner.resize_kv(num_blocks, {})
        blocks.grow(num_blocks)
    elif num_blocks < old:
        keep = num_blocks - 1                      # usable blocks below the cut (0 is the null block)
        evicted = prefix.stats.evicted_blocks
        if blocks.num_used > keep and prefix.enabled:
            prefix.reclaim(blocks.num_used - keep)
        while blocks.num_used > keep and allow_preempt and sched.running:
            sched.preempt(sched.running[-1])
            res.preempted += 1
            if prefix.enabled and blocks.num_used > keep:
                prefix.reclaim(blocks.num_used - keep)
        res.evicted_blocks = prefix.stats.evicted_blocks - evicted
        if blocks.num_used > keep:
            num_blocks = blocks.num_used + 1
            res.clamped = f"kept {num_blocks} blocks: running sequences hold them (no preemption)"
        moves = _compaction(blocks, num_blocks)
        res.moved_blocks = len(moves)
        runner.resize_kv(num_blocks, moves)
        blocks.relocate(moves)
        for seq in sched.running:
            seq.block_table = [moves.get(b, b) for b in seq.block_table]
            seq.pending_copies = [(moves.get(s, s), moves.get(d, d), n) for s, d, n in seq.pending_copies]
        prefix.relocate(moves)
        blocks.truncate(num_blocks)
    res.blocks_after = blocks.num_blocks
    engine.capacity_tokens = (blocks.num_blocks - 1) * blocks.block_size
    return res


def _compaction(blocks, num_blocks: int) -> dict[int, int]:
    """Held blocks at or above the cut -> free blocks below it (lowest first)."""
    high = [b for b in range(num_blocks, blocks.num_blocks) if blocks.ref[b] > 0]
    low = sorted(b for b in blocks.free if b < num_blocks)
    assert len(low) >= len(high), "compaction needs a free block below the cut for each held one above"
    return dict(zip(high, low))


def min_blocks(engine) -> int:
    """The smallest pool: one max_model_len sequence, the floor the start-up plan keeps too (so
    a request the engine accepted at start is never refused later, and every live request,
    preempted or not, can run to its end alone)."""
    return max(2, -(-engine.max_model_len // engine.blocks.block_size) + 1)


def max_blocks(engine) -> int:
    bs = engine.blocks.block_size
    return max(2, -(-(engine.settings.max_num_seqs * engine.max_model_len) // bs) + 1)
