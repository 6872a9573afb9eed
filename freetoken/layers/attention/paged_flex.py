"""Attention that reads the paged KV cache in place (torch `flex_attention`): the device path.

The gathered path (attention.gather) copies every sequence's whole KV into a padded batch per
layer per step before SDPA. Here the cache tensor itself is the key/value sequence (a strided
view `[1, Hkv, slots, D]`, expanded over the batch without a copy) and a `BlockMask` lists, per
sequence, the physical blocks of its block table: the fused kernel visits only those blocks,
and a mask function keeps, inside them, the keys the query may see:

    member[b, slot // bs]                       the block is in sequence b's table
    start[slot // bs] + slot % bs <= q_pos      causal (a block's positions are the same in
                                                every table that shares it: prefix blocks sit
                                                at the same place in every sharer)
    ... > q_pos - window                        sliding window
    selected[b, q, key position]                DSA: the indexer's top-k (MLA layers)

Sinks (gpt-oss) merge after the kernel from its log-sum-exp: out * sigmoid(lse - sink).
The per-step tables (`member` [B, blocks], `start` [blocks], the block mask) are built once per
step and shared by every layer (cached on the step's `AttentionMetadata`).

On CUDA `flex_attention` runs compiled (a fused Triton kernel honouring the block sparsity);
if compiling fails the caller falls back to the gathered path with one warning. On the CPU
it runs eagerly (the whole cache is scored: for tests only; the CPU default is the C kernels
and the blockwise prefill attention). FlashInfer is not used yet.
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)
BLOCK_Q = 128

try:
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
except ImportError:                                 # torch without flex attention
    BlockMask = flex_attention = None
try:
    from torch.nn.attention.flex_attention import AuxRequest
except ImportError:                                 # older torch: return_lse
    AuxRequest = None

_compiled = {}
_broken = False


def available(device: torch.device) -> bool:
    return flex_attention is not None and not (device.type == "cuda" and _broken)


def _kernel(device: torch.device):
    if device.type != "cuda":
        return flex_attention
    fn = _compiled.get(device)
    if fn is None:
        fn = _compiled[device] = torch.compile(flex_attention, dynamic=True)
    return fn


@dataclass
class PagedTables:
    """One step's view of the block tables (shared by every layer of that step)."""
    member: torch.Tensor        # [B, num_blocks] bool
    start: torch.Tensor         # [num_blocks] position of each block's first row
    q_pos: torch.Tensor         # [B, Qmax]
    kv_num: torch.Tensor        # [B, 1, nqb] int32 blocks to visit
    kv_idx: torch.Tensor        # [B, 1, nqb, max_blocks] int32 physical block ids
    block_size: int
    num_slots: int


def tables(meta, num_slots: int, block_size: int) -> PagedTables:
    key = ("paged", num_slots, block_size)
    t = meta.masks.get(key)
    if t is not None:
        return t
    dev = meta.key_slots.device
    bs = block_size
    b, kmax = meta.key_slots.shape
    nblk = num_slots // bs
    lens = (meta.context_lens.to(dev) if meta.context_lens is not None       # real keys per sequence
            else (meta.key_positions <= meta.query_positions.amax(1, keepdim=True)).sum(1))
    blocks = meta.key_slots[:, ::bs] // bs                          # [B, ceil(Kmax / bs)] block ids
    used = torch.arange(blocks.shape[1], device=dev)[None] < ((lens + bs - 1) // bs)[:, None]
    member = torch.zeros(b, nblk, dtype=torch.bool, device=dev)
    member.scatter_(1, torch.where(used, blocks, 0), used)
    member[:, 0] = False                                            # the null block
    # fixed shapes, no boolean indexing (a host sync; CUDA graphs capture this): unused entries
    # write 0 into the null block's start, which no mask reads
    first = (torch.arange(blocks.shape[1], device=dev)[None] * bs).expand_as(blocks)
    start = torch.zeros(nblk, dtype=torch.int64, device=dev)
    start.scatter_(0, torch.where(used, blocks, 0).reshape(-1), torch.where(used, first, 0).reshape(-1))
    qmax = meta.query_positions.shape[1]
    nqb = -(-qmax // BLOCK_Q)
    # flex wants every physical block in each row's order, the ones to visit first
    idx = torch.argsort((~member).to(torch.int8), dim=1, stable=True).to(torch.int32)
    kv_idx = idx[:, None, None, :].expand(b, 1, nqb, nblk)
    kv_num = member.sum(1).to(torch.int32)[:, None, None].expand(b, 1, nqb).contiguous()
    t = meta.masks[key] = PagedTables(member, start, meta.query_positions, kv_num, kv_idx, bs, num_slots)
    return t


def paged_flex_attention(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, meta,
                         block_size: int, scale: float, window: int | None = None,
                         sinks: torch.Tensor | None = None, selected: torch.Tensor | None = None) -> torch.Tensor:
    """queries [B, Hq, Qmax, D] (gathered per sequence: only the step's new tokens); keys [slots,
    Hkv, D] and values [slots, Hkv, Dv] the cache tensors themselves (or column views of them)
    -> [B, Hq, Qmax, Dv] in queries' dtype. `selected` [B, 1, Qmax, Kmax]: DSA's chosen keys."""
    t = tables(meta, keys.shape[0], block_size)
    b = queries.shape[0]
    dtype = keys.dtype
    k = keys.permute(1, 0, 2)[None].expand(b, -1, -1, -1)
    v = values.permute(1, 0, 2)[None].expand(b, -1, -1, -1)
    member, start, q_pos, bs = t.member, t.start, t.q_pos, t.block_size
    kmax = selected.shape[-1] if selected is not None else 0

    def mask_mod(bi, h, qi, ki):
        blk = ki // bs
        kpos = start[blk] + ki % bs
        qp = q_pos[bi, qi]
        ok = member[bi, blk] & (kpos <= qp)
        if window is not None:
            ok = ok & (kpos > qp - window)
        if selected is not None:
            ok = ok & selected[bi, 0, qi, kpos.clamp(max=kmax - 1)]
        return ok | ((qp < 0) & (ki == 0))          # padded query rows see the null slot: no NaN

    qmax = queries.shape[2]
    mask = BlockMask.from_kv_blocks(t.kv_num, t.kv_idx, BLOCK_SIZE=(BLOCK_Q, bs), mask_mod=mask_mod,
                                    seq_lengths=(qmax, keys.shape[0]))
    aux = {"return_aux": AuxRequest(lse=True)} if AuxRequest is not None else {"return_lse": True}
    with warnings.catch_warnings():                 # eager on the CPU is intended (tests)
        warnings.simplefilter("ignore", UserWarning)
        out, lse = _kernel(queries.device)(queries.to(dtype), k, v, block_mask=mask, scale=scale,
                                           enable_gqa=k.shape[1] != queries.shape[1], **aux)
    lse = getattr(lse, "lse", lse)
    if sinks is not None:
        out = out.float() * torch.sigmoid(lse.float() - sinks.float()[None, :, None]).unsqueeze(-1)
    return out.to(queries.dtype)


def disable(error: BaseException) -> None:
    """The compiled kernel failed on this device: gathered SDPA from now on, said once."""
    global _broken
    if not _broken:
        log.warning("paged flex attention unavailable on this device (%s: %s); gathering each sequence's KV "
                    "per step instead", type(error).__name__, error)
    _broken = True
