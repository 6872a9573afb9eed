"""Every default size the engine falls back to when an option is not set, in one place: the
options (config.py), the CLI help, the memory plan, the experts backend builder and the engine read
these names, so a default cannot differ between what is planned, allocated and documented.
No imports: any module may read it."""

GiB = 1 << 30

KV_CACHE_GIB = 4.0            # KV budget cap: max_num_seqs x max_model_len tokens, at most this
STATE_CACHE_GIB = 8.0         # measured: the 2 GiB first tried evicted snapshots agent edits needed (docs/prefix-cache.md)
MAX_MODEL_LEN = 32768         # cap on the checkpoint's max_position_embeddings (and its value when absent)
HOST_HEADROOM_GIB = 2.0       # host memory left to the rest of the machine: at least this ...
HOST_HEADROOM_DIVISOR = 10    # ... or host memory / this, the larger
DEVICE_HEADROOM_GIB = 1.0     # CUDA: activations' allocator slack, other programs
MIN_PREFILL_CHUNK = 256       # the plan halves max_num_batched_tokens down to this, no further
HOST_CACHE_SHARE = 0.6        # disk tier turned on by itself: host cache = this share of the budget after dense weights
HOST_CACHE_FORCED_SHARE = 0.5  # disk tier forced with no size: this share of the pool
SPIN_US = 200                 # FREETOKEN_SPIN_US: kernel-pool workers spin this long before sleeping


def max_model_len(max_position_embeddings: int | None) -> int:
    """The context window when max_model_len is not set: the checkpoint's, capped."""
    return min(int(max_position_embeddings or MAX_MODEL_LEN), MAX_MODEL_LEN)


def expert_cache_slots(n: int, experts_per_layer: int) -> int:
    """Cache slots of an expert cache in host memory given no size: a quarter of the pool's n
    experts, at least two layers' worth, at most the pool."""
    return min(n, max(2 * experts_per_layer, n // 4))
