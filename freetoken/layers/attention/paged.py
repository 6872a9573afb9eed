"""Attention over a paged KV cache.

The runner describes one engine step as `AttentionMetadata`: where each new token's K/V
is written (`slot_mapping`) and, per sequence in the batch, which cache slots hold its
keys (`key_slots`, padded with the null slot 0) and which flat tokens are its queries
(`query_index`, padded with a dummy row). On the CPU, decode steps run the C kernel over the
cache in place and prefill chunks the blockwise causal attention of `prefill_attention` (no
mask). On CUDA attention reads the cache in place (`paged_flex`: the cache tensor with the
step's block tables as a block mask, no per-step KV copy). Otherwise (CPU sliding windows, the
device fallback) it is one batched SDPA over gathered keys with a boolean mask, so prefill
chunks and decode tokens of many sequences run in one call.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ...kernels import cpu_kernels
from ...kernels.pool import CpuPool
from ..zeros import zeros
from ..kernel_rows import GEMV_TOKENS
from . import paged_flex, prefill as prefill_attention

_KV_CODE = {torch.float32: 0, torch.bfloat16: 1}
# seconds the C decode attention has run in this process: a verify row runs the block loops of a
# decode row, so a plain step's share prices each extra row (engine/spec/price.py's prior)
KERNEL_SECONDS = [0.0]


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor      # [N] cache slot of each new token
    key_slots: torch.Tensor         # [B, Kmax] cache slots of each sequence's keys (0 = null)
    key_positions: torch.Tensor     # [B, Kmax] position of each key (huge for padding)
    query_index: torch.Tensor       # [B, Qmax] flat token index of each query (N = dummy)
    query_positions: torch.Tensor   # [B, Qmax] position of each query (-1 for padding)
    num_tokens: int
    context_lens: torch.Tensor | None = None   # [B] keys of each sequence (int64, on the host)
    kernel_pool: CpuPool | None = None         # the CPU kernels' pool: decode attention in C
    block_size: int = 0                        # KV block size (0: unknown, no paged in-place path)
    paged: bool | None = None                  # read the cache in place (paged_flex); None: on CUDA
    # key_slots padded past the longest context (decode CUDA graphs' fixed Kmax): never skip the mask
    padded_keys: bool = False
    masks: dict = field(default_factory=dict)
    verify: tuple | None = None                # verify_rows' answer, worked out by the first layer
    row_args: tuple | None = None              # a one-row step's C arguments (decode_half.step_args), by the first layer
    ring_args: tuple | None = None             # its sliding-window rings' (decode_half.ring_args), by the first such layer
    rows_args: tuple | None = None             # one sequence's few rows' (verify_half.rows_args), by the first layer

    def use_paged(self, q: torch.Tensor) -> bool:
        """True when attention reads the paged cache in place (paged_flex.py) instead of
        gathering each sequence's KV: by default on CUDA; `paged=True` forces it (tests, CPU)."""
        if self.block_size <= 0 or self.paged is False:
            return False
        dev = q.device          # (asked once: a CPU decode step asks this every layer)
        if self.paged is None and dev.type != "cuda":
            return False
        return paged_flex.available(dev)

    def mask(self, window: int | None = None) -> torch.Tensor:
        """[B, 1, Qmax, Kmax] True where a query may attend a key (causal, optional window)."""
        m = self.masks.get(window)
        if m is None:
            q = self.query_positions.unsqueeze(-1)
            k = self.key_positions.unsqueeze(-2)
            m = k <= q
            if window is not None:
                m &= k > q - window
            m[..., 0] |= self.query_positions < 0   # padded queries attend the null slot, never NaN
            m = self.masks[window] = m.unsqueeze(1)
        return m

    def decode_kernel(self, q: torch.Tensor, cache_dtype: torch.dtype, window: int | None) -> bool:
        """True when the C decode attention applies: one query per sequence on the CPU, every
        cached key visible (no window cut), float32 queries, fp32/bf16 cache."""
        return (self.kernel_pool is not None and self.context_lens is not None
                and self.query_index.shape[1] == 1 and q.device.type == "cpu" and q.dtype == torch.float32
                and cache_dtype in _KV_CODE and (window is None or self.key_slots.shape[1] <= window))

    def verify_kernel(self, q: torch.Tensor, cache_dtype: torch.dtype, window: int | None) -> bool:
        """True when a step of a few queries per sequence (a verify of drafted tokens, a short
        chunk) runs the C decode kernel once per query: each row then gets the bits a one-query
        decode step at its position gets (batch invariance, so drafts never change greedy output)."""
        return (self.kernel_pool is not None and self.context_lens is not None and 1 < self.query_index.shape[1]
                and self.num_tokens <= GEMV_TOKENS and q.device.type == "cpu" and q.dtype == torch.float32
                and cache_dtype in _KV_CODE and (window is None or self.key_slots.shape[1] <= window))


class KVCache:
    """K and V for one attention layer: [num_slots, kv_heads, head_dim]; slot 0..block_size-1 is the null block.
    The dtype may be narrower than the activations' (bf16 KV under fp32 compute on the CPU).

    `values=False` keeps one row per token and no V: a latent cache (MLA's compressed KV plus
    its rope key, DSA's indexer key), whose layer derives keys and values from that row."""

    def __init__(self, num_slots: int, kv_heads: int, head_dim: int, dtype, device, values: bool = True):
        # pages zeroed by the kernel when a block is first written, not all at start
        self.k = zeros((num_slots, kv_heads, head_dim), dtype, device)
        self.v = zeros((num_slots, kv_heads, head_dim), dtype, device) if values else None

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None) -> None:
        if slots.numel() <= GEMV_TOKENS and write_rows_c(self, slots, k, v):
            return
        self.k.index_copy_(0, slots, k if k.dtype == self.k.dtype else k.to(self.k.dtype))
        if self.v is not None:
            self.v.index_copy_(0, slots, v if v.dtype == self.v.dtype else v.to(self.v.dtype))

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + (self.v.nbytes if self.v is not None else 0)


def write_rows_c(cache: KVCache, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None) -> bool:
    """A decode/verify step's few fp32 K/V rows into a CPU cache (fp32 or bf16) by one C call,
    the values `index_copy_` of `.to(cache dtype)` stores (bf16 rounded to nearest even), in
    place of ~4 torch ops a layer. False (nothing written) where the C path does not apply."""
    kc, vc = cache.k, cache.v
    if ((v is None) != (vc is None) or kc.device.type != "cpu" or kc.dtype not in _KV_CODE
            or (lib := cpu_kernels()) is None or slots.dtype != torch.int64 or not slots.is_contiguous()):
        return False
    row = kc.shape[1] * kc.shape[2]
    for src in (k, v) if v is not None else (k,):
        if (src.dtype != torch.float32 or src.dim() != 3 or src.shape[1:] != kc.shape[1:]
                or src.stride(2) != 1 or (src.shape[1] > 1 and src.stride(1) != kc.shape[2]) or src.shape[0] != slots.numel()):
            return False
    if lib.ft_kv_write(k.data_ptr(), k.stride(0), v.data_ptr() if v is not None else None,
                       v.stride(0) if v is not None else 0, k.shape[0], row, slots.data_ptr(), kc.shape[0],
                       kc.data_ptr(), vc.data_ptr() if vc is not None else None, _KV_CODE[kc.dtype]):
        raise IndexError(f"a KV slot is outside the cache's {kc.shape[0]} rows")
    return True


def kv_values_per_token(kv_layers: list[tuple]) -> int:
    """Cache values one token costs over a model's `kv_layers()` entries: (layer, kv heads,
    head dim) keeps K and V; (layer, 1, row, False) keeps one latent row."""
    return sum((2 if len(s) < 4 or s[3] else 1) * s[1] * s[2] for s in kv_layers)


def gather_rows(rows: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """[num_slots, ...] cache rows -> [B, Kmax, ...] rows of each sequence's keys."""
    # index_select, not advanced indexing: the latter takes a slow generic path (measured ~200x slower).
    b, kmax = meta.key_slots.shape
    return rows.index_select(0, meta.key_slots.reshape(-1)).view(b, kmax, *rows.shape[1:])


def gather_queries(q: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """[N, Hq, D] flat queries -> [B, Hq, Qmax, D] per sequence (padding rows are zeros)."""
    n, hq, d = q.shape
    b = meta.key_slots.shape[0]
    q_pad = torch.cat([q, q.new_zeros(1, hq, d)]) if meta.query_index.numel() != n else q
    qmax = meta.query_index.shape[1]
    return q_pad.index_select(0, meta.query_index.reshape(-1)).view(b, qmax, hq, d).transpose(1, 2)


def gather(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, meta: AttentionMetadata,
           convert: bool = True):
    """Write the step's K/V into the cache, then lay out per-sequence batches:
    queries [B, Hq, Qmax, D], keys and values [B, Hkv, Kmax, D] (in q's dtype when `convert`)."""
    cache.write(meta.slot_mapping, k, v)
    keys, values = gather_rows(cache.k, meta).transpose(1, 2), gather_rows(cache.v, meta).transpose(1, 2)
    if convert and keys.dtype != q.dtype:
        keys, values = keys.to(q.dtype), values.to(q.dtype)
    return gather_queries(q, meta), keys, values


def scatter(out: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """[B, Hq, Qmax, D] per-sequence outputs -> [N, Hq, D] in flat token order."""
    out = out.transpose(1, 2)                           # [B, Qmax, Hq, D]
    n = meta.num_tokens
    if meta.key_slots.shape[0] == 1 and meta.query_index.numel() == n:
        return out.reshape(n, out.shape[2], out.shape[3])
    flat = out.new_empty(n + 1, out.shape[2], out.shape[3])
    flat.index_copy_(0, meta.query_index.reshape(-1), out.reshape(-1, out.shape[2], out.shape[3]))
    return flat[:n]


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache,
                     meta: AttentionMetadata, scale: float, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Decode steps on the CPU (see `AttentionMetadata.decode_kernel`): the new K/V go into the
    cache, then the C kernel reads each sequence's keys in place, no gather copies and no
    SDPA set-up (torch's CPU flash attention costs ~0.8 ms per layer at 600 keys)."""
    cache.write(meta.slot_mapping, k, v)
    return attend_rows(meta.kernel_pool, q, cache.k, cache.v, meta.key_slots, meta.context_lens, scale, sinks)


def verify_rows(meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(flat rows of the step's queries, their sequences' key slots [R, Kmax], keys each reads
    [R]): the query at position p reads its sequence's keys [0, p] (key j of a sequence sits at
    key_slots[., j]), the same keys in the same order as a decode step at p."""
    real = meta.query_positions >= 0
    seq = torch.arange(real.shape[0]).unsqueeze(1).expand_as(real)[real]
    return meta.query_index[real], meta.key_slots.index_select(0, seq), meta.query_positions[real] + 1


def in_flat_order(out: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Per-query results `out` [R, ...] of `verify_rows` back in the step's flat token order."""
    n = out.shape[0]
    if bool((rows == torch.arange(n)).all()):
        return out
    return torch.empty_like(out).index_copy_(0, rows, out)


def verify_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache,
                     meta: AttentionMetadata, scale: float, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Several queries per sequence (see `AttentionMetadata.verify_kernel`) as one-query rows of
    the decode kernel, each row the bits of a decode step at its position. The rows are the
    same in every layer: worked out once a step (~30 us a layer of small tensor ops), and where
    they are the flat order already (one sequence verifying) the queries go in as they are."""
    cache.write(meta.slot_mapping, k, v)
    if meta.verify is None:
        rows, slots, lens = verify_rows(meta)
        meta.verify = (rows, slots, lens, bool((rows == torch.arange(q.shape[0])).all()))
    rows, slots, lens, flat = meta.verify
    if flat:
        return attend_rows(meta.kernel_pool, q, cache.k, cache.v, slots, lens, scale, sinks)
    out = attend_rows(meta.kernel_pool, q.index_select(0, rows), cache.k, cache.v, slots, lens, scale, sinks)
    return torch.empty_like(out).index_copy_(0, rows, out)


def attend_rows(pool: CpuPool, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                lens: torch.Tensor, scale: float, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """One query token per sequence: q [S, Hq, D] fp32 attends rows slots[s, :lens[s]] of
    keys/values [rows, Hkv, D] (fp32/bf16, contiguous) -> [S, Hq, D] fp32."""
    n, hq, d = q.shape
    q = q.contiguous()
    out = torch.empty_like(q)
    t = time.perf_counter()
    with pool.lock:
        rc = pool.lib.ft_decode_attention(
            pool.handle, q.data_ptr(), n, hq, keys.shape[1], d, keys.data_ptr(), values.data_ptr(),
            _KV_CODE[keys.dtype], slots.data_ptr(), slots.shape[1], lens.data_ptr(), scale,
            sinks.data_ptr() if sinks is not None else None, out.data_ptr())
    KERNEL_SECONDS[0] += time.perf_counter() - t
    if rc != 0:
        raise MemoryError("decode attention kernel could not allocate its scratch memory")
    return out


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache,
                    meta: AttentionMetadata, scale: float, window: int | None = None,
                    prefill_dtype: torch.dtype | None = None) -> torch.Tensor:
    """q [N, Hq, D], k/v [N, Hkv, D] for the step's new tokens -> [N, Hq, D]. prefill_dtype: what
    the CPU prefill attention multiplies in (default q's dtype)."""
    if meta.use_paged(q):
        cache.write(meta.slot_mapping, k, v)
        out = in_place(gather_queries(q, meta), cache.k, cache.v, meta, scale, window)
        if out is not None:
            return scatter(out, meta)
    if meta.decode_kernel(q, cache.k.dtype, window):
        return decode_attention(q, k, v, cache, meta, scale)
    if meta.verify_kernel(q, cache.k.dtype, window):
        return verify_attention(q, k, v, cache, meta, scale)
    if (q.device.type == "cpu" and prefill_attention.available() and meta.context_lens is not None
            and meta.query_index.shape[1] > 1 and (window is None or meta.key_slots.shape[1] <= window)):
        queries, keys, values = gather(q, k, v, cache, meta, convert=False)
        q_lens = (meta.query_positions >= 0).sum(1).tolist()
        out = prefill_attention.causal_batch(queries, keys, values, q_lens, meta.context_lens.tolist(), scale,
                                             prefill_dtype or q.dtype, meta.kernel_pool)
        return scatter(out, meta)
    queries, keys, values = gather(q, k, v, cache, meta)
    return scatter(masked_sdpa(queries, keys, values, meta, scale, window), meta)


def masked_sdpa(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, meta: AttentionMetadata,
                scale: float, window: int | None = None) -> torch.Tensor:
    """SDPA of gathered [B, Hq, Qmax, D] queries over [B, Hkv, Kmax, D] keys (values may have
    another head dim) with the step's causal/window mask, skipped where it is implied."""
    b, hq, qmax, _ = queries.shape
    kmax = keys.shape[2]
    mask, causal = meta.mask(window), False
    if b == 1 and not meta.padded_keys and (window is None or kmax <= window):
        if qmax == 1:                       # one sequence decoding: every cached key is visible
            mask = None
        elif qmax == kmax:                  # one fresh prompt: plain causal attention (fast kernel path)
            mask, causal = None, True
    return F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, is_causal=causal,
                                          scale=scale, enable_gqa=keys.shape[1] != hq)


def in_place(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, meta: AttentionMetadata,
             scale: float, window: int | None = None, sinks: torch.Tensor | None = None,
             selected: torch.Tensor | None = None) -> torch.Tensor | None:
    """paged_flex over the cache tensors; None when the device kernel fails (then the caller
    gathers, and every later call does: the failure is logged once)."""
    try:
        return paged_flex.paged_flex_attention(queries, keys, values, meta, meta.block_size, scale, window,
                                               sinks, selected)
    except Exception as e:                  # a compile/launch failure on the device: gathered path
        if queries.device.type != "cuda":
            raise
        paged_flex.disable(e)
        return None
