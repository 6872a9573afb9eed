"""A decode row's attention half of a decoder layer in one C call (`ft_attn_half`,
kernels/c/attn_half.c): input RMSNorm, the qkv GEMV, q/k norms + rope, the K/V write, the decode
attention, the o GEMV, the residual add and the post-attention RMSNorm. The separate path takes
~40 Python-level calls a layer between those kernels (checks, fresh tensors, views), each ~5-20
us once the kernels have streamed megabytes through the caches; this one takes one, on scratch
rows allocated once per layer. Same kernels in the same order on the same operands: the same
bits (tests/layers/test_decode_half.py compares both paths)."""
from __future__ import annotations

import ctypes
import weakref

import torch

from ...kernels import cpu_kernels
from ...quant.ggml_act import ACT_MODES
from .paged import _KV_CODE as KV_CODE, KERNEL_SECONDS
from ..ggml_linear import GgmlLinear
from ..norm import RMSNorm

# the one-call path on (tests switch it off to compare with the separate calls)
FUSED = [True]
_UNCHECKED = (object, object)     # (callables that return no cache's k or v: the first cache seen is checked)

_vp, _i64, _f64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double


class _Dense(ctypes.Structure):       # attn_half.c's ft_dense_ref
    _fields_ = [("kind", _i64), ("fmt", _i64), ("w", _vp), ("w_rs", _i64), ("s", _vp), ("s_rs", _i64),
                ("segs", _vp), ("nseg", _i64), ("N", _i64), ("K", _i64), ("bias", _vp)]


class _Layer(ctypes.Structure):       # attn_half.c's ft_attn_layer
    _fields_ = [("qkv", _Dense), ("o", _Dense), ("router", _Dense), ("in_w", _vp), ("post_w", _vp), ("qw", _vp), ("kw", _vp),
                ("sinks", _vp),
                ("in_eps", _f64), ("post_eps", _f64), ("q_eps", _f64), ("k_eps", _f64), ("scale", _f64),
                ("hidden", _i64), ("heads", _i64), ("kv_heads", _i64), ("D", _i64), ("rot", _i64),
                ("xn", _vp), ("qkv_out", _vp), ("qk", _vp), ("att", _vp), ("o_out", _vp), ("logits", _vp)]


def plain_norm(norm) -> bool:
    """A plain fp32 RMSNorm (the one-call paths' norms: `ft_rms_norm` on its weight as it is)."""
    return type(norm) is RMSNorm and norm.weight.dtype == torch.float32 and norm.weight.is_contiguous()


class AttnHalf:
    """One layer's `ft_attn_half`: its weights' pointers and its scratch rows, set up once.
    `attn` is a models/decoder.Attention (the caller checks the class: a subclass's other math
    never comes here); `router`, the MoE block's router (a `Linear`) whose logits of the normed
    row the call also computes, or None."""

    def __init__(self, attn, input_norm: RMSNorm, post_norm: RMSNorm, router, lib, pool):
        self.attn, self.lib, self.pool, self.router = attn, lib, pool, router
        self.ggml = isinstance(attn.qkv, GgmlLinear) or isinstance(attn.o, GgmlLinear)
        self.weights = self._weights()
        hidden, heads, kvh, d = input_norm.weight.numel(), attn.heads, attn.kv_heads, attn.head_dim
        f32 = dict(dtype=torch.float32)
        # scratch rows and outputs, reused every step (nothing outside the layer keeps them)
        self.bufs = [torch.empty(1, n, **f32) for n in (hidden, attn.qkv.out_features, (heads + kvh) * d, heads * d,
                                                        hidden)]
        self.h, self.normed = torch.empty(1, hidden, **f32), torch.empty(1, hidden, **f32)
        self.logits = torch.empty(1, router.out_features, **f32) if router is not None else None
        qw = kw = None
        if attn.q_norm is not None:
            qw, kw = attn.q_norm.weight.data_ptr(), attn.k_norm.weight.data_ptr()
        # gpt-oss's learned sinks (models/gpt_oss.SinkAttention), as its separate calls pass them
        self.sinks = attn.sinks.float().contiguous() if getattr(attn, "sinks", None) is not None else None
        self.layer = _Layer(_Dense(*attn.qkv.decode_ref()), _Dense(*attn.o.decode_ref()),
                            _Dense(*router.decode_ref()) if router is not None else _Dense(),
                            input_norm.weight.data_ptr(), post_norm.weight.data_ptr(), qw, kw,
                            self.sinks.data_ptr() if self.sinks is not None else None,
                            input_norm.eps, post_norm.eps, attn.q_norm.eps if qw else 0.0,
                            attn.k_norm.eps if kw else 0.0, attn.scale, hidden, heads, kvh, d, attn.rotary.dim,
                            *[b.data_ptr() for b in self.bufs], self.logits.data_ptr() if router is not None else None)
        self.norms = (input_norm, post_norm)     # (their weights stay alive while the pointers are used)
        self.ref = ctypes.byref(self.layer)
        self.seconds = ctypes.c_double(0.0)
        self.seconds_ref = ctypes.byref(self.seconds)
        self.kv = _UNCHECKED        # the KV cache's (k, v) once checked, then its C arguments (`_cache_ok`)
        self.moe = None             # the MoE block's decode row on these rows, where its caller made one
        self.rows = None            # its verify rows' call (verify_half.VerifyHalf), made on first use

    @classmethod
    def build(cls, attn, input_norm, post_norm, router=None) -> AttnHalf | None:
        """The one-call path of this layer, or None where it does not apply: the kernels' GEMVs
        for qkv and o (and the router) on one pool of the native library, plain fp32 norms, no
        clip, per-head or no q/k norms. A router the call cannot take is left to its caller."""
        lib, pool = cpu_kernels(), getattr(attn.qkv, "pool", None)
        if router is not None and (getattr(router, "pool", None) is not pool or not hasattr(router, "decode_ref")
                                   or router.decode_ref() is None):
            router = None
        if (lib is None or not hasattr(lib, "ft_attn_half") or pool is None or pool.lib is not lib
                or getattr(attn.o, "pool", None) is not pool or not hasattr(attn.qkv, "decode_ref")
                or not hasattr(attn.o, "decode_ref") or attn.clip is not None or attn.qk_norm not in (None, "head")
                or not (plain_norm(input_norm) and plain_norm(post_norm))
                or input_norm.weight.shape != post_norm.weight.shape
                or (attn.qk_norm == "head" and not (plain_norm(attn.q_norm) and plain_norm(attn.k_norm)))
                or attn.qkv.decode_ref() is None or attn.o.decode_ref() is None):
            return None
        return cls(attn, input_norm, post_norm, router, lib, pool)

    def stale(self) -> bool:
        """The layer's weights were replaced since the pointers were taken."""
        w = self.weights
        return (getattr(self.attn.qkv, "weight", None) is not w[0] or getattr(self.attn.o, "weight", None) is not w[1]
                or getattr(self.router, "weight", None) is not w[2])

    def _weights(self) -> tuple:
        return tuple(getattr(m, "weight", None) for m in (self.attn.qkv, self.attn.o, self.router))

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache, meta, ring=None):
        """(h = x + attention, post_norm(h), the router's logits of it or None) of one decode row
        x [1, hidden] (fp32, contiguous), this layer's reused rows; None where the step is not a
        one-row C decode step (the caller runs the separate calls). What a step's layers share
        is checked by its first (`step_args`), this layer's cache once a cache (`_cache_ok`).
        ring: (SlidingWindowKV, this layer's index in it) of the step's one sequence for a
        sliding-window layer that keeps its keys there instead of in `cache` (gpt-oss)."""
        step = self.step(x, cos, sin, cache, meta, ring)
        if step is None:
            return None
        kv = (step[4], *self.kv[2:], step[5], step[6], step[7]) if ring is None else self._ring(ring, cos, meta)
        if kv is None:
            return None
        self.seconds.value = 0.0
        with self.pool.lock:
            rc = self.lib.ft_attn_half(self.pool.handle, self.ref, x.data_ptr(), step[2], step[3], *kv,
                                       self.h.data_ptr(), self.normed.data_ptr(), self.seconds_ref)
        KERNEL_SECONDS[0] += self.seconds.value
        raise_for(rc, kv[1])
        return self.h, self.normed, self.logits

    def step(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache, meta, ring=None) -> tuple | None:
        """The step's shared arguments (`step_args`) where this layer takes the call on row x
        this step, else None (a ring layer's own arguments: `_ring`)."""
        step = meta.row_args
        if step is None or step[0] is not cos:     # the first layer of a step works them out
            step = meta.row_args = step_args(x, cos, sin, meta, self.lib)
        if (step[1] is not self.pool or (self.ggml and step[8]) or x.dtype is not torch.float32
                or x.shape != self.h.shape or not x.is_contiguous()):
            return None
        if ring is None and (not self.cache_ready(cache)
                             or (self.attn.window is not None and step[6] > self.attn.window)):  # (decode_kernel's window rule)
            return None
        return step

    def _ring(self, ring, cos, meta) -> tuple | None:
        """ft_attn_half's KV arguments (slot, rows, k, v, kv type, key rows, their count, count)
        of a sliding-window layer's ring, or None where it cannot take the call. The ring rows
        the step writes and reads are the same for each such layer: the first works them out."""
        sw, layer = ring
        step = self.ring_step(sw, cos, meta)
        if step is None:
            return None
        off = layer * step[5]
        return step[2], sw.window, step[3] + off, step[4] + off, step[6], step[7], step[8], step[9]

    def ring_step(self, sw, cos, meta) -> tuple | None:
        """The step's shared arguments of ring sw (`ring_args`, worked out by its first layer)
        where this layer can take them, else None."""
        step = meta.ring_args
        if step is None or step[0] is not cos or step[1] is not sw:
            step = meta.ring_args = ring_args(cos, sw)
        if step[2] is None or sw.k.shape[2:] != (self.attn.kv_heads, self.attn.head_dim):
            return None
        return step

    def cache_ready(self, cache) -> bool:
        """Whether this layer's KV cache can take the call: the one checked last, or checked now."""
        return (cache.k is self.kv[0]() and cache.v is self.kv[1]()) or self._cache_ok(cache)

    def _cache_ok(self, cache) -> bool:
        """Whether this layer's KV cache tensors can take the call (kept, by weak references
        that do not hold a resized cache's old memory, with their C arguments)."""
        kc, vc = cache.k, cache.v
        ok = (vc is not None and kc.dtype in KV_CODE and kc.shape[1] == self.attn.kv_heads
              and kc.shape[2] == self.attn.head_dim and kc.is_contiguous() and vc.is_contiguous())
        self.kv = ((weakref.ref(kc), weakref.ref(vc), kc.shape[0], kc.data_ptr(), vc.data_ptr(), KV_CODE[kc.dtype])
                   if ok else _UNCHECKED)
        return ok


def raise_for(rc: int, rows: int) -> None:
    """The error of `ft_attn_half`'s return code rc (0: none); rows, the layer's KV rows."""
    if rc == -1:
        raise IndexError(f"a KV slot is outside the cache's {rows} rows")
    if rc == -3:
        raise ValueError("ggml GEMV kernel refused the layer")
    if rc != 0:
        raise MemoryError("a decode kernel could not allocate its scratch memory")


def step_args(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta, lib) -> tuple:
    """What every layer of a step shares: (cos, the kernels' pool where the step is a one-row C
    decode step else None, then the pointers of cos, sin, the row's slot, the key slots, their
    count, the context length, and whether the ggml rows' decode activations are fp32 (their
    layers do not take the call: `ft_ggml_linear_run` would quantize them otherwise)."""
    slots, keys, lens = meta.slot_mapping, meta.key_slots, meta.context_lens
    ok = (meta.num_tokens == 1 and cos.dtype is torch.float32 and cos.is_contiguous() and sin.is_contiguous()
          and not meta.use_paged(x) and meta.decode_kernel(x, torch.float32, None)
          and slots.dtype is torch.int64 and keys.dtype is torch.int64 and lens.dtype is torch.int64
          and slots.is_contiguous() and keys.is_contiguous() and lens.is_contiguous())
    if not ok:
        return cos, None, 0, 0, 0, 0, 0, 0, True
    return (cos, meta.kernel_pool, cos.data_ptr(), sin.data_ptr(), slots.data_ptr(), keys.data_ptr(), keys.shape[1],
            lens.data_ptr(), lib.ft_set_ggml_act(-1) == ACT_MODES["float32"])


def ring_args(cos: torch.Tensor, sw) -> tuple:
    """What a step's sliding-window layers share, of one sequence's ring (layers/state.SlidingWindowKV,
    its token at position p in ring row p % window): (cos, the ring, the pointer of the new row's
    ring row, of k and v, one layer's bytes, the kv type code, the pointer of the ring rows of
    the window's positions oldest first (the new row's last), their count, the pointer of that
    count); the new row's pointer None where the ring cannot take the call. Every int64 the call
    reads is an entry of two constant tables per window size (`_ring_tables`): no tensor a step."""
    k, v = sw.k, sw.v
    if v is None or k.dtype not in KV_CODE or v.dtype is not k.dtype or not k.is_contiguous() or not v.is_contiguous():
        return cos, sw, None
    p, w = sw.position, sw.window
    mod, counts = _RING_TABLES.get(w) or _ring_tables(w)
    n = min(p + 1, w)          # the window's positions max(0, p + 1 - w) .. p are mod[lo % w:][:n]
    return (cos, sw, mod + 8 * (p % w), k.data_ptr(), v.data_ptr(), k.stride(0) * k.element_size(), KV_CODE[k.dtype],
            mod + 8 * (max(0, p + 1 - w) % w), n, counts + 8 * n)


_RING_TABLES: dict[int, tuple[int, int]] = {}
_RING_KEEP: list[torch.Tensor] = []


def _ring_tables(w: int) -> tuple[int, int]:
    """The pointers of (i % w for i < 2w) and (0 .. w), int64, kept for the process's life."""
    mod, counts = torch.arange(2 * w, dtype=torch.int64).remainder_(w), torch.arange(w + 1, dtype=torch.int64)
    _RING_KEEP.extend((mod, counts))
    _RING_TABLES[w] = mod.data_ptr(), counts.data_ptr()
    return _RING_TABLES[w]
