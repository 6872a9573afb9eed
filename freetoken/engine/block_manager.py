"""Paged KV blocks: reference-counted, shared between sequences and the prefix cache.

Block 0 is the null block (always zero) that padded attention reads point to; it is never
handed out. Every other block is either free (ref 0, on the free list) or held: once by
each sequence whose block table lists it and once by the prefix tree if a tree node owns
it (`cached[b]`). A cached block whose only holder is the tree is *reclaimable*: when free
blocks run short, `take` asks the `reclaimer` (the prefix cache) to evict such blocks.
Invariant: `reclaimable == #{b : cached[b] and ref[b] == 1}`, kept by incref/decref.
"""
from __future__ import annotations

from .sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 2:
            raise ValueError(f"KV cache too small: {num_blocks} blocks of {block_size} tokens (need >= 2)")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.free = list(range(num_blocks - 1, 0, -1))
        self.ref = [0] * num_blocks
        self.cached = bytearray(num_blocks)   # 1 where a prefix-tree node owns the block
        self.reclaimable = 0
        self.reclaimer = None                  # .reclaim(n) evicts; .unpinned(b) learns b became reclaimable

    # --- single blocks -------------------------------------------------------------------
    def take(self) -> int:
        if not self.free and self.reclaimer is not None:
            self.reclaimer.reclaim(1)
        b = self.free.pop()
        self.ref[b] = 1
        return b

    def incref(self, b: int) -> None:
        r = self.ref[b] = self.ref[b] + 1
        if r == 2 and self.cached[b]:
            self.reclaimable -= 1

    def decref(self, b: int) -> int:
        """Drop one reference; the block goes back to the free list at zero. Returns the new count."""
        r = self.ref[b] = self.ref[b] - 1
        if r == 0:
            if self.cached[b]:
                self.cached[b] = 0
                self.reclaimable -= 1
            self.free.append(b)
        elif r == 1 and self.cached[b]:
            self.reclaimable += 1
            self.reclaimer.unpinned(b)
        elif r < 0:
            raise AssertionError(f"KV block {b} released more often than it was taken")
        return r

    def mark_cached(self, b: int) -> None:
        """The prefix tree takes its own reference to a block a sequence holds, and owns it."""
        if self.ref[b] < 1 or self.cached[b]:
            raise AssertionError(f"KV block {b}: the tree adopts only held, uncached blocks")
        self.cached[b] = 1
        self.ref[b] += 1

    # --- sequences -----------------------------------------------------------------------
    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        need = -(-num_tokens // self.block_size)
        return max(0, need - len(seq.block_table))

    @property
    def available(self) -> int:
        """Blocks that can be handed out now: free plus those only the prefix tree holds."""
        return len(self.free) + self.reclaimable

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= self.available

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        n = self.blocks_needed(seq, num_tokens)
        if n > len(self.free) and self.reclaimer is not None:
            self.reclaimer.reclaim(n - len(self.free))
        for _ in range(n):
            seq.block_table.append(self.take())

    def release(self, seq: Sequence) -> None:
        for b in reversed(seq.block_table):
            self.decref(b)
        seq.block_table = []

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        """Blocks held by anyone (sequences or the prefix tree), the null block excluded."""
        return self.num_blocks - 1 - len(self.free)
