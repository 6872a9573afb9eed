"""Continuous batching: every step decodes all running sequences and fills the rest of the
token budget with (chunks of) waiting prompts.

A waiting sequence first takes its longest cached prefix from the prefix tree, and is
admitted only when the rest of its prompt fits the free and reclaimable KV blocks (with a
block of growth room for each running sequence), so admission does not start work it would
have to throw away. A waiting prompt that shares a longer prefix with one still being
prefilled waits for that one to publish it: a shared prefix is computed once. When blocks
still run out, the newest running sequence is preempted: its computed prefix stays in the
tree and it resumes from there later — nothing is lost."""
from __future__ import annotations

import logging
from collections import deque

from .block_manager import BlockManager
from .prefix.cache import PrefixCache
from .sequence import Sequence, Status

log = logging.getLogger("freetoken.engine")


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 prefix: PrefixCache | None = None, on_preempt=None):
        self.blocks = blocks
        self.prefix = prefix or PrefixCache(blocks, enabled=False)
        self.max_num_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.on_preempt = on_preempt
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _chunk(self, seq: Sequence, budget: int) -> int:
        n = min(seq.num_pending, budget)
        stop = self.prefix.next_stop(seq)
        return min(n, stop - seq.num_computed) if stop is not None else n

    def schedule(self) -> list[tuple[Sequence, int]]:
        """[(sequence, number of new tokens to run)] for this step."""
        batch: list[tuple[Sequence, int]] = []
        budget = self.budget
        for seq in list(self.running):
            if budget <= 0:
                break
            if seq not in self.running:          # preempted below to make room
                continue
            n = self._chunk(seq, budget)
            while not self.blocks.can_allocate(seq, seq.num_computed + n):
                victim = self.running[-1]
                self.preempt(victim)
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                continue
            n += self._fit_draft(seq, n, budget - n)
            self.blocks.allocate(seq, seq.num_computed + n)
            batch.append((seq, n))
            budget -= n
        deferred = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting.popleft()
            if self.prefix.enabled and self._prefilling_shares(seq):
                deferred.append(seq)            # the running one publishes the shared prefix first
                continue
            if not self._admit(seq):
                self.waiting.appendleft(seq)
                break
            n = self._chunk(seq, budget)
            self.blocks.allocate(seq, seq.num_computed + n)
            seq.status = Status.RUNNING
            self.running.append(seq)
            batch.append((seq, n))
            budget -= n
        self.waiting.extendleft(reversed(deferred))
        return batch

    def _fit_draft(self, seq: Sequence, n: int, budget: int) -> int:
        """Draft positions a decoding sequence verifies this step after its pending token: its
        draft cut to the token budget and the blocks free now (a draft never preempts)."""
        if not seq.draft:
            return 0
        k = min(len(seq.draft), budget) if n == seq.num_pending == 1 else 0
        while k and not self.blocks.can_allocate(seq, seq.num_computed + n + k):
            k -= 1
        seq.draft = seq.draft[:k]
        return k

    def _admit(self, seq: Sequence) -> bool:
        """Take the cached prefix; keep it only if the rest of the prompt fits, leaving a
        block of growth room for each running sequence."""
        self.prefix.admit(seq)
        need = self.blocks.blocks_needed(seq, len(seq) + 1) + len(self.running)
        if need <= self.blocks.available:
            return True
        self.prefix.undo_admit(seq)
        return False

    def _prefilling_shares(self, seq: Sequence) -> bool:
        """Is a running sequence still prefilling a prompt that shares more than a block with
        this one beyond what it has published to the tree?"""
        bs = self.blocks.block_size
        head = seq.prompt_ids[:bs + 1]
        for other in self.running:
            if other.num_computed < len(other.prompt_ids) and other.prompt_ids[:bs + 1] == head:
                if _common_prefix_len(seq.prompt_ids, other.prompt_ids) > (len(other.tree_path) + 1) * bs:
                    return True
        return False

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.prefix.release(seq)
        seq.num_computed = 0
        seq.state = None
        seq.draft = []
        seq.prompt_logits = []
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        log.info("preempted request %s (%d tokens) to free KV blocks; it resumes from its cached prefix",
                 seq.request_id, len(seq))
        if self.on_preempt:
            self.on_preempt(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.prefix.release(seq, final=True, publish=reason != "error")   # a failed request's rows may be half-made
        seq.state = None


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    lo, hi = 0, n                       # binary search on slice equality: C-speed compares
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
