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

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Give back the blocks past the first `num_tokens` tokens (rejected draft rows)."""
        keep = -(-num_tokens // self.block_size)
        while len(seq.block_table) > keep:
            self.decref(seq.block_table.pop())

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

    @property
    def num_usable(self) -> int:
        """Blocks that can ever be handed out: all but the null block. The one total that
        /v1/memory, /health and /metrics report."""
        return self.num_blocks - 1

    @property
    def num_held_by_requests(self) -> int:
        """Blocks some sequence holds; blocks only the prefix tree holds are not counted
        (they are cached, and handed out again when free blocks run short)."""
        return self.num_used - self.reclaimable

    # --- elastic pool (engine/kv_resize.py) ------------------------------------------------
    def grow(self, num_blocks: int) -> None:
        """More blocks: the new ids go to the bottom of the free list, so low ids keep being
        handed out first and the pool stays compact for a later shrink."""
        old = self.num_blocks
        self.ref += [0] * (num_blocks - old)
        self.cached += bytearray(num_blocks - old)
        self.free = list(range(num_blocks - 1, old - 1, -1)) + self.free
        self.num_blocks = num_blocks

    def relocate(self, moves: dict[int, int]) -> None:
        """Held block b now lives at free block moves[b] (its rows were copied there)."""
        free = set(self.free)
        for b, d in moves.items():
            if self.ref[b] < 1 or d not in free:
                raise AssertionError(f"KV block move {b}->{d}: the source must be held, the target free")
            self.ref[d], self.cached[d] = self.ref[b], self.cached[b]
            self.ref[b], self.cached[b] = 0, 0
            free.discard(d)
            free.add(b)
        self.free = sorted(free, reverse=True)

    def truncate(self, num_blocks: int) -> None:
        """Drop the ids >= num_blocks; all of them must be free."""
        if any(self.ref[num_blocks:]):
            raise AssertionError(f"KV pool shrink to {num_blocks} blocks: a block above that is held")
        if num_blocks < 2:
            raise ValueError(f"KV cache too small: {num_blocks} blocks (need >= 2)")
        self.ref = self.ref[:num_blocks]
        self.cached = self.cached[:num_blocks]
        self.free = [b for b in self.free if b < num_blocks]
        self.num_blocks = num_blocks

    def check(self, held_by_sequences: list[list[int]] = ()) -> None:
        """Invariants: every block is free xor held; refs equal the holders' count (the block
        tables given plus the tree's one), so nothing leaked or was released twice."""
        assert self.ref[0] == 0 and 0 not in self.free, "the null block was handed out"
        assert len(set(self.free)) == len(self.free), "a block is twice on the free list"
        free = set(self.free)
        want = [0] * self.num_blocks
        for table in held_by_sequences:
            for b in table:
                want[b] += 1
        for b in range(1, self.num_blocks):
            assert (b in free) == (self.ref[b] == 0), f"KV block {b}: ref {self.ref[b]}, free {b in free}"
            assert self.ref[b] == want[b] + self.cached[b], f"KV block {b}: ref {self.ref[b]} != holders"
        assert self.reclaimable == sum(1 for b in range(self.num_blocks) if self.cached[b] and self.ref[b] == 1)
