"""Continuous batching: every step decodes all running sequences and fills the rest of the
token budget with (chunks of) waiting prompts. When KV blocks run out, the newest running
sequence is preempted and later recomputed — nothing is lost."""
from __future__ import annotations

from collections import deque

from .block_manager import BlockManager
from .sequence import Sequence, Status


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int, on_preempt=None):
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.on_preempt = on_preempt

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[tuple[Sequence, int]]:
        """[(sequence, number of new tokens to run)] for this step."""
        batch: list[tuple[Sequence, int]] = []
        budget = self.budget
        for seq in list(self.running):
            if budget <= 0:
                break
            if seq not in self.running:          # preempted below to make room
                continue
            n = min(seq.num_pending, budget)
            while not self.blocks.can_allocate(seq, seq.num_computed + n):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                continue
            self.blocks.allocate(seq, seq.num_computed + n)
            batch.append((seq, n))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            n = min(seq.num_pending, budget)
            if not self.blocks.can_allocate(seq, seq.num_computed + n):
                break
            self.waiting.popleft()
            self.blocks.allocate(seq, seq.num_computed + n)
            seq.status = Status.RUNNING
            self.running.append(seq)
            batch.append((seq, n))
            budget -= n
        return batch

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.release(seq)
        seq.num_computed = 0
        seq.state = None
        seq.prompt_logits = []
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        if self.on_preempt:
            self.on_preempt(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.release(seq)
        seq.state = None
