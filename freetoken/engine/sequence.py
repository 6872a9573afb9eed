"""One request as the engine sees it."""
from __future__ import annotations

import enum

import torch

from ..sampling_params import SamplingParams
from .detokenizer import IncrementalDetokenizer


class Status(enum.Enum):
    WAITING = 0
    RUNNING = 1
    FINISHED = 2


class Sequence:
    def __init__(self, request_id: str, prompt_ids: list[int], params: SamplingParams, tokenizer,
                 default_seed: int, want_prompt_logits: bool = False):
        self.request_id = request_id
        self.prompt_ids = list(prompt_ids)
        self.output_ids: list[int] = []
        self.params = params
        self.status = Status.WAITING
        self.block_table: list[int] = []
        self.num_computed = 0                 # tokens whose K/V (and state) are computed
        self.state = None                     # recurrent state of hybrid models
        self.generator = torch.Generator().manual_seed(params.seed if params.seed is not None else default_seed)
        self.detok = IncrementalDetokenizer(tokenizer, prompt_ids, params.stop) if tokenizer else None
        self.finish_reason: str | None = None
        self.want_prompt_logits = want_prompt_logits
        self.prompt_logits: list[torch.Tensor] = []
        self.counts: dict[int, int] = {}      # output token -> occurrences (penalties)
        # prefix cache (see engine/prefix/cache.py)
        self.prompt_computed = 0              # prompt tokens this request ran through the model
        self.tree_path: list = []             # tree nodes of block_table's published prefix
        self.checkpoint_plan: list[int] = []  # positions to snapshot the state at during prefill
        self.pending_checkpoints: dict = {}   # position -> snapshot not yet hung on the tree
        self.pending_copies: list[tuple[int, int, int]] = []   # (src block, dst block, rows)
        # speculative decoding (spec/): tokens drafted to verify in this step after the pending one
        self.draft: list[int] = []
        self.draft_source = None              # the spec.Draft they came from
        self.draft_snapshot = None            # the state before a verify (models with a state)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_pending(self) -> int:
        """Tokens still to run through the model before the next sample."""
        return len(self) - self.num_computed

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache rather than computed (so far)."""
        return max(0, min(self.num_computed, len(self.prompt_ids)) - self.prompt_computed)

    def append(self, token: int) -> None:
        self.output_ids.append(token)
        self.counts[token] = self.counts.get(token, 0) + 1
