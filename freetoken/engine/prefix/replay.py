"""Replay token sequences through the engine's own scheduler, KV block manager, prefix tree
and checkpoint policy, without a model: what `freetoken sim sessions` measures.

Each request is admitted, chunk-prefilled and finished exactly as `LLMEngine.step` does it;
only the forward pass is missing (the state of a hybrid model is a stand-in of the real
snapshot size). The generated tokens are appended at once instead of one decode step each,
which leaves the same blocks and checkpoints behind.
"""
from __future__ import annotations

from ...sampling_params import SamplingParams
from ..block_manager import BlockManager
from .checkpoint_policy import CheckpointPolicy
from .cache import PrefixCache
from ..scheduler import Scheduler
from ..sequence import Sequence


class StandInState:
    """A sequence state of a given snapshot size (what a hybrid model would copy)."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.parts = {"state": self}

    def snapshot(self) -> "StandInState":
        return StandInState(self.nbytes)

    def restore(self, snap: "StandInState") -> None:
        pass


def make_policy(kind: str, anchors=None, state_checkpoints: int = 16) -> CheckpointPolicy:
    if kind == "periodic":
        return CheckpointPolicy.llama_cpp()
    return CheckpointPolicy(kind, anchors=anchors, per_session=state_checkpoints)


class PrefixReplay:
    def __init__(self, block_size: int = 16, num_blocks: int = 1 << 16, state_bytes: int = 0,
                 policy: str = "anchors", state_checkpoints: int = 16, state_cache_gib: float = 8.0,
                 anchors=None, max_num_batched_tokens: int = 2048, enabled: bool = True):
        self.blocks = BlockManager(num_blocks, block_size)
        make_state = (lambda: StandInState(state_bytes)) if state_bytes else None
        self.prefix = PrefixCache(self.blocks, enabled=enabled, make_state=make_state,
                                  policy=make_policy(policy, anchors, state_checkpoints),
                                  state_budget_bytes=int(state_cache_gib * (1 << 30)))
        self.scheduler = Scheduler(self.blocks, 1, max_num_batched_tokens, self.prefix)
        self.make_state = make_state
        self._n = 0

    def request(self, prompt_ids: list[int], output_ids: list[int]) -> dict:
        """Serve one request to completion; returns its token accounting."""
        self._n += 1
        seq = Sequence(f"replay-{self._n}", prompt_ids, SamplingParams(max_tokens=max(1, len(output_ids))), None, 0)
        self.scheduler.add(seq)
        while seq.num_pending:
            batch = self.scheduler.schedule()
            if not batch:
                raise RuntimeError(f"request of {len(prompt_ids)} tokens does not fit {self.blocks.num_blocks} KV blocks")
            for s, n in batch:
                self.prefix.copies_done(s)
                if s.state is None and self.make_state is not None:
                    s.state = self.make_state()
                s.prompt_computed += max(0, min(s.num_computed + n, len(s.prompt_ids)) - s.num_computed)
                s.num_computed += n
                self.prefix.after_step(s)
        for t in output_ids:
            seq.append(t)
        if output_ids:                   # decode: each generated token but the last is computed
            self.blocks.allocate(seq, len(seq) - 1)
            seq.num_computed = len(seq) - 1
            self.prefix.after_step(seq)
        self.scheduler.finish(seq, "stop")
        return {"prompt_tokens": len(prompt_ids), "cached_tokens": seq.num_cached_tokens,
                "computed_tokens": seq.prompt_computed, "checkpoints": self.prefix.num_checkpoints,
                "checkpoint_bytes": self.prefix.checkpoint_bytes}
