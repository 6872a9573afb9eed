"""What the runner hands a model for one forward pass."""
from __future__ import annotations

from dataclasses import dataclass

from ..layers.attention import AttentionMetadata, KVCache


@dataclass
class ForwardContext:
    attn: AttentionMetadata
    kv: dict[int, KVCache]          # layer index -> paged KV of that attention layer
    states: list                    # per sequence in batch order: the object model.make_state() gave
    query_lens: list[int]           # new tokens per sequence in batch order (their flat tokens are contiguous)
    phase: str                      # "prefill" or "decode"
