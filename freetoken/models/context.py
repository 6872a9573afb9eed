"""What a model gets from outside: `BuildContext`, what the loader hands its constructor (the few
engine options it reads and the resolved settings), and `ForwardContext`, what the runner hands
it for one forward pass."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..defaults import SPIN_US
from ..layers.attention.paged import AttentionMetadata, KVCache

if TYPE_CHECKING:
    from ..config import EngineConfig, Settings


@dataclass(frozen=True)
class BuildContext:
    """What a model constructor reads from the engine options, and the resolved `settings`
    (None: tools such as `convert` that build the model for its tensors alone). A model builds its
    dense modules and seats for its experts; the loader builds the experts and attaches them."""
    cfg: EngineConfig
    spin_us: int = SPIN_US
    settings: Settings | None = None

    torch_device = property(lambda self: self.cfg.torch_device)
    torch_dtype = property(lambda self: self.cfg.torch_dtype)       # storage: embeddings, experts, KV
    compute_dtype = property(lambda self: self.cfg.compute_dtype)   # requested; kernels.choices decides
    dense_format = property(lambda self: self.cfg.dense_format)
    num_threads = property(lambda self: self.cfg.num_threads)
    prefill_gemm = property(lambda self: self.cfg.prefill_gemm)     # forced CPU choices, or "auto"
    bf16_dot = property(lambda self: self.cfg.bf16_dot)
    decode_gemv = property(lambda self: self.cfg.decode_gemv)
    decode_attention = property(lambda self: self.cfg.decode_attention)
    prefill_attention = property(lambda self: self.cfg.prefill_attention)
    int8_tiles = property(lambda self: self.cfg.int8_tiles)
    kernel_isa = property(lambda self: self.cfg.kernel_isa)
    ggml_numerics = property(lambda self: self.cfg.ggml_numerics)


@dataclass
class ForwardContext:
    attn: AttentionMetadata
    kv: dict[int, KVCache]          # layer index -> paged KV of that attention layer
    states: list                    # per sequence in batch order: the object model.make_state() gave
    query_lens: list[int]           # new tokens per sequence in batch order (their flat tokens are contiguous)
    phase: str                      # "prefill" or "decode"
