"""A verify's rows through a decoder layer's attention half in one C call (`ft_attn_half_rows`,
kernels/c/attn_half.c): the pending token and its k drafts of one sequence (or a short chunk of
it), T rows at once through input RMSNorm, the qkv GEMV, q/k norms + rope, the K/V write, the
decode attention of T one-query rows, the o GEMV, the residual add and the post-attention
RMSNorm. The separate path (`Attention.__call__` on T rows) makes the same calls on the same
operands in the same order, with ~40 Python-level calls a layer between them (~0.1 ms a layer
of a verify on the dense bench model); this one makes one, on scratch rows shared by the layers
of one kernel pool: the same bits (tests/layers/test_verify_half.py compares both paths)."""
from __future__ import annotations

import ctypes
import weakref

import torch

from .decode_half import AttnHalf, raise_for
from .paged import KERNEL_SECONDS, verify_rows

_vp = ctypes.c_void_p


class _Scratch(ctypes.Structure):     # attn_half.c's ft_rows_scratch
    _fields_ = [("xn", _vp), ("qkv_out", _vp), ("qk", _vp), ("q", _vp), ("att", _vp), ("o_out", _vp)]


# Scratch rows by kernel pool, then by the layer's sizes: one set for all the layers of a model
# (~0.9 MB of 16 rows at hidden 2048, where a set per layer held ~40 MB over 48 layers). The
# pool's lock serialises the calls that write them, and a layer's caller consumes its outputs
# (`DecoderLayer.rows_call`: h + mlp(normed) is a new tensor) before the next layer's call.
_SHARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _rows(pool, max_rows: int, widths: tuple[int, ...]) -> list[torch.Tensor]:
    by_size = _SHARED.setdefault(pool, {})
    key = (max_rows, widths)
    if key not in by_size:
        by_size[key] = [torch.empty(max_rows, n, dtype=torch.float32) for n in widths]
    return by_size[key]


class VerifyHalf:
    """`ft_attn_half_rows` of one layer (its `AttnHalf`'s weights and sizes) on up to `max_rows`
    rows: the scratch rows and the outputs, shared with the pool's other layers of these sizes and
    reused every step (the caller reads the outputs before any other layer's call)."""

    def __init__(self, half: AttnHalf, max_rows: int):
        a = half.attn
        hidden, heads, kvh, d = half.h.shape[1], a.heads, a.kv_heads, a.head_dim
        self.half, self.max_rows = half, max_rows
        *self.bufs, self.h, self.normed = _rows(half.pool, max_rows, (
            hidden, a.qkv.out_features, (heads + kvh) * d, heads * d, heads * d, hidden, hidden, hidden))
        self.scratch = _Scratch(*[b.data_ptr() for b in self.bufs])
        self.scratch_ref = ctypes.byref(self.scratch)
        self.seconds = ctypes.c_double(0.0)
        self.seconds_ref = ctypes.byref(self.seconds)

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache, meta):
        """(h = x + attention, post_norm(h)) of the step's T rows x [T, hidden] (fp32, contiguous,
        2 <= T <= max_rows), views of this layer's reused rows; None where the step is not one
        sequence's few rows on the C decode kernels (the caller runs the separate calls)."""
        half, n = self.half, x.shape[0]
        step = meta.rows_args
        if step is None or step[0] is not cos:      # the first layer of a step works them out
            step = meta.rows_args = rows_args(x, cos, sin, meta, half.lib)
        if (step[1] is not half.pool or not 1 < n <= self.max_rows
                or x.dtype is not torch.float32 or x.shape[1] != self.h.shape[1] or not x.is_contiguous()):
            return None
        if (not half.cache_ready(cache)
                or (half.attn.window is not None and step[6] > half.attn.window)):   # (verify_kernel's window rule)
            return None
        self.seconds.value = 0.0
        with half.pool.lock:
            rc = half.lib.ft_attn_half_rows(half.pool.handle, half.ref, n, self.scratch_ref, x.data_ptr(), step[2],
                                            step[3], step[4], *half.kv[2:], step[5], step[6], step[7],
                                            self.h.data_ptr(), self.normed.data_ptr(), self.seconds_ref)
        KERNEL_SECONDS[0] += self.seconds.value
        raise_for(rc, half.kv[2])
        return self.h[:n], self.normed[:n]


def rows_args(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta, lib) -> tuple:
    """What every layer of a step shares: (cos, the kernels' pool where the step is one
    sequence's few rows on the C decode kernels (`verify_attention`'s flat case) else None, then
    the pointers of cos, sin, the rows' slots, each row's key slots, their count a row, each
    row's key count)."""
    slots = meta.slot_mapping
    ok = (cos.dtype is torch.float32 and cos.is_contiguous() and sin.is_contiguous() and not meta.use_paged(x)
          and meta.verify_kernel(x, torch.float32, None) and slots.dtype is torch.int64 and slots.is_contiguous()
          and hasattr(lib, "ft_attn_half_rows"))
    if ok and meta.verify is None:      # (verify_attention's rows, shared with any layer that takes that path)
        rows, keys, lens = verify_rows(meta)
        meta.verify = (rows, keys, lens, bool((rows == torch.arange(x.shape[0])).all()))
    if not ok or not meta.verify[3]:
        return cos, None, 0, 0, 0, 0, 0, 0
    _, keys, lens, _ = meta.verify
    if not (keys.dtype is torch.int64 and lens.dtype is torch.int64 and keys.is_contiguous() and lens.is_contiguous()):
        return cos, None, 0, 0, 0, 0, 0, 0
    return (cos, meta.kernel_pool, cos.data_ptr(), sin.data_ptr(), slots.data_ptr(), keys.data_ptr(), keys.shape[1],
            lens.data_ptr())
