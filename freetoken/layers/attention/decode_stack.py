"""A decode row through every decoder layer in one C call (`ft_layers_row`,
kernels/c/layers_row.c): each layer's attention half (`AttnHalf`, decode_half.py) then its MoE
block's row (`MoERow`, experts/execution/decode_row.py), then the model's final RMSNorm: the very
calls the per-layer path makes, in the same order on the same operands: the same bits (tests/layers/test_decode_stack.py
compares both paths). What it saves is the Python between them: per layer the return through
`DecoderLayer`, the next layer's checks and two ctypes calls, ~25 + ~80 us of CPU a layer on a
medium shape once the kernels have flushed the interpreter's code and data from the caches. The
checks still run every step, all before the call (`DecodeStack.__call__`). A sliding-window layer
that keeps its keys in the sequence's ring (gpt-oss: `DecoderLayer.row_ring`) takes the ring's
rows in the call as its own call does (`AttnHalf(..., ring)`): the step's ring arguments once."""
from __future__ import annotations

import ctypes

import torch

from .decode_half import AttnHalf, FUSED as ATTN_HALF, plain_norm, raise_for
from .paged import KERNEL_SECONDS

# the one-call stack on (tests switch it off to compare with the per-layer calls)
STACK = [True]

_vp, _i64, _f64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double


class _RowLayer(ctypes.Structure):     # layers_row.c's ft_row_layer
    _fields_ = [("L", _vp), ("num_slots", _i64), ("kc", _vp), ("vc", _vp), ("kvt", _i64), ("h", _vp), ("normed", _vp),
                ("d", _vp), ("logits", _vp), ("E", _i64), ("k", _i64), ("norm", _i64), ("after", _i64),
                ("offset", _i64), ("ids", _vp), ("flat", _vp), ("w", _vp), ("out", _vp), ("counts", _vp),
                ("sum", _vp), ("distinct", _i64), ("moe_seconds", _f64), ("ring", _i64)]


class _Ring(ctypes.Structure):         # layers_row.c's ft_ring_args (decode_half.ring_args' pointers)
    _fields_ = [("slot", _vp), ("rows", _i64), ("k", _vp), ("v", _vp), ("layer_bytes", _i64), ("kvt", _i64),
                ("key_slots", _vp), ("kmax", _i64), ("nkeys", _vp)]


class DecodeStack:
    """`ft_layers_row` over `layers` (models/decoder.DecoderLayer), every one with its attention
    half and its MoE row built (`DecoderLayer._half`) on one pool and one lock, only the last
    layer's output a new row each step (`MoERow.fresh`)."""

    def __init__(self, layers: list, halves: list[AttnHalf]):
        self.layers, self.halves = layers, halves
        self.rows = [h.moe for h in halves]
        self.lib, self.pool = halves[0].lib, halves[0].pool
        self.table = (_RowLayer * len(layers))()
        for t, half, row in zip(self.table, halves, self.rows):
            a = row.args      # ft_moe_row's: pool, desc, logits, E, k, norm, after, offset, x, xt, ids, flat, w, out,
            #                   residual, sum, counts
            t.L, t.h, t.normed = ctypes.addressof(half.layer), half.h.data_ptr(), half.normed.data_ptr()
            t.d, t.logits, t.E, t.k, t.norm, t.after, t.offset = ctypes.cast(a[1], _vp).value, *a[2:8]
            t.ids, t.flat, t.w, t.out, t.counts, t.sum = a[10], a[11], a[12], a[13], a[16], a[15]
        # each layer's index in the sequence's ring, or None: its keys in the paged cache
        self.slots = [layer.slot for layer in layers]
        for t, slot in zip(self.table, self.slots):
            t.ring = -1 if slot is None else slot
        self.ring = _Ring()
        self.ring_ref = ctypes.byref(self.ring) if any(s is not None for s in self.slots) else None
        self.kvs = [None] * len(layers)       # each table row's cache arguments (the half's `kv` they came from)
        self.att = ctypes.c_double(0.0)
        self.att_ref = ctypes.byref(self.att)

    @classmethod
    def build(cls, layers: list) -> DecodeStack | None:
        """The stack's call where every layer takes both layer-sized calls, else None."""
        halves = [getattr(layer, "half", None) for layer in layers]
        if not layers or any(type(h) is not AttnHalf or h.moe is None for h in halves):
            return None
        pool, lib = halves[0].pool, halves[0].lib
        for i, h in enumerate(halves):
            row = h.moe
            if (h.pool is not pool or h.lib is not lib or row.lib is not lib or row.lock is not pool.lock
                    or row.args[0] != pool.handle or row.fresh != (i == len(layers) - 1)
                    or row.rows[0] is not h.normed or row.rows[1] is not h.logits or row.rows[2] is not h.h):
                return None
        return cls(layers, halves) if hasattr(lib, "ft_layers_row") else None

    def current(self, layers: list) -> bool:
        """Whether this stack was built on `layers`' halves as they are now."""
        return layers is self.layers and all(layer.half is h for layer, h in zip(layers, self.halves))

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx,
                 norm=None) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """(the last layer's output row of decode row x [1, hidden], `norm` of it or None), or
        None where some layer would not take its calls this step (the caller runs the layers
        one by one). `norm`: the model's final RMSNorm, computed in the same call where it is a
        plain fp32 one (`plain_norm`), else left to the caller (None in its place)."""
        if not (STACK[0] and ATTN_HALF[0]):
            return None
        step, inp, ring = None, x, None
        for i, (layer, half, row, slot) in enumerate(zip(self.layers, self.halves, self.rows, self.slots)):
            if half.stale() or not layer.mlp.row_live(row):
                return None
            if slot is not None:          # its keys in the ring: the ring's arguments, shared by the step
                rg = layer.row_ring(ctx)
                if rg is None or (step := half.step(inp, cos, sin, None, ctx.attn, rg)) is None \
                        or (ring := half.ring_step(rg[0], cos, ctx.attn)) is None:
                    return None
                inp = row.out
                continue
            step = half.step(inp, cos, sin, ctx.kv[i], ctx.attn)
            if step is None:
                return None
            if half.kv is not self.kvs[i]:
                t = self.table[i]
                t.num_slots, t.kc, t.vc, t.kvt = half.kv[2:6]
                self.kvs[i] = half.kv
            inp = row.out
        last = self.rows[-1]
        last.out = torch.empty_like(last.out)
        self.table[len(self.rows) - 1].sum = last.out.data_ptr()
        normed = torch.empty_like(last.out) if norm is not None and plain_norm(norm) else None
        nargs = (norm.weight.data_ptr(), last.out.shape[1], norm.eps, normed.data_ptr()) if normed is not None \
            else (None, 0, 0.0, None)
        if ring is not None:
            r = self.ring
            r.slot, r.rows, r.k, r.v, r.layer_bytes, r.kvt, r.key_slots, r.kmax, r.nkeys = \
                ring[2], ring[1].window, *ring[3:]
        self.att.value = 0.0
        with self.pool.lock:
            rc = self.lib.ft_layers_row(self.pool.handle, self.table, len(self.rows), x.data_ptr(), *step[2:8],
                                        self.att_ref, *nargs, self.ring_ref)
        KERNEL_SECONDS[0] += self.att.value
        done = len(self.rows) if rc == 0 else rc // 16 - 1     # the MoE rows that ran
        for t, row in zip(self.table[:done], self.rows[:done]):
            row.calls += 1
            row.distinct += t.distinct
            row.seconds += t.moe_seconds
        if rc:
            code = rc % 16
            if code <= 3:
                raise_for(-code, ctx.kv[done].k.shape[0] if self.slots[done] is None else ring[1].window)
            raise IndexError("expert id out of range of the banks") if code == 4 else \
                MemoryError("CPU expert kernel could not allocate its scratch memory")
        return last.out, normed
