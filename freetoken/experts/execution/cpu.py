"""CPU expert execution straight from the host pool banks.

`CpuExpertExecutor.run` computes, for routed (token, flat expert id, gate weight) triples,
sum_k w[t,k] * down(act(gate(x[t])) * up(x[t])) with the C kernels of `kernels/` (weights
dequantized inside the dot products, fp32 accumulation, a persistent pinned thread pool).
Experts that receive many tokens in one call (prefill) go through torch GEMMs instead, where
the weights are reused enough for a blocked matmul to beat streaming dot products; bf16 and
ggml (llama.cpp block types) experts do that inside the kernel instead, through the GEMM tiles
(kernels/gemm.py, kernels/c/ggml_tiles.c), when the library's switches are on.

Bank layouts and codecs: `formats.py`.
"""
from __future__ import annotations

import ctypes
import logging

import torch

from ... import kernels
from ...kernels.pool import CpuPool
from ..ggml_banks import KERNEL_TYPES, check_ggml_banks
from ..formats import ACTIVATIONS, get_format, resolve_format, spec_format, weight_keys
from ..memory.pool import ExpertSpec
from .torch_exec import run_experts
from ...quant.ggml_quants import type_name

log = logging.getLogger(__name__)

# Tokens per expert from which dequantize + torch matmul beats the streaming kernel (measured
# single-threaded on Zen AVX2: fp32 sgemm wins from ~200 tokens per expert for float banks;
# for quantized banks torch's dequantization costs more than it saves).
_GEMM_TOKENS = {"fp32": 192, "bf16": 192, "fp16": 192}


class CpuExpertExecutor:
    """Runs routed experts on the CPU from host banks; see the module docstring for layouts.

    gemm_tokens: experts receiving at least this many tokens in one call are computed with
    dequantize + torch matmul (prefill); 0 disables the split; None = the format's default.
    isa: "native" (widest SIMD the compiler finds here), "portable" (plain C), or "torch" (no
    compiled kernel; the reference path). pool: a `CpuPool` to share (the engine's one pool for
    dense layers and experts); None creates a private one with num_threads/pin/spin_us."""

    def __init__(self, banks: dict[str, torch.Tensor], fmt: str, hidden: int, intermediate: int,
                 activation: str = "silu", alpha: float = 1.702, limit: float = 7.0,
                 num_threads: int | None = None, *, gemm_tokens: int | None = None, isa: str = "native",
                 pin: bool = True, spin_us: int = 200, pool: CpuPool | None = None):
        self.fmt = resolve_format(banks, fmt)
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown expert activation {activation!r}; expected one of {tuple(ACTIVATIONS)}")
        self.banks, self.H, self.I = banks, hidden, intermediate
        self.activation, self.alpha, self.limit = activation, alpha, limit
        self.spec = ExpertSpec(hidden, intermediate, spec_format(self.fmt), activation, alpha, limit)
        self.gemm_tokens = _GEMM_TOKENS.get(self.fmt, 0) if gemm_tokens is None else gemm_tokens
        block = get_format(self.fmt).block
        if hidden % block or intermediate % block:
            raise ValueError(f"{self.fmt} experts need hidden and intermediate to be multiples of {block}")
        self._bias = {k: banks[k].float().contiguous() for k in ("gate_up_bias", "down_bias") if k in banks}
        self._desc = self._make_desc()   # validates the banks before any thread starts
        self._desc_ref = ctypes.byref(self._desc)     # (a byref a decode call: ~1 us)
        self._sums: dict[int, torch.Tensor] = {}       # decode(residual=...)'s experts' sums, per row count
        self.lib = None if isa == "torch" else kernels.load(isa)
        self.num_threads, self._own_pool = 1, pool is None
        self._pool, self._deq = None, None
        if self.lib is None:
            self.isa = "torch"
            return
        self.isa = self.lib.ft_isa().decode()
        self._pool = pool if pool is not None else CpuPool(self.lib, num_threads, pin, spin_us)
        self.num_threads = self._pool.num_threads

    @classmethod
    def from_pool(cls, expert_pool, **kw) -> "CpuExpertExecutor":
        """An executor over an `ExpertPool`'s banks with its spec's shapes and activation (pass
        `pool=` to share threads; a `GroupedPool`: host_exec.cpu_executor)."""
        sp = expert_pool.spec
        return cls(expert_pool.banks, sp.fmt, sp.hidden, sp.intermediate, sp.activation, sp.alpha, sp.limit, **kw)

    def _make_desc(self) -> kernels.Desc:
        gk, gsk, dk, dsk = weight_keys(self.fmt)
        b = self.banks
        n = b[gk].shape[0]

        def geom(t: torch.Tensor | None, rows: int, what: str):
            if t is None:
                return None, 0, 0
            if t.device.type != "cpu" or not t[0].is_contiguous() or t.shape[0] != n:
                raise ValueError(f"bank {what} must be a CPU tensor with contiguous rows and {n} experts")
            if t.shape[1] != rows:
                raise ValueError(f"bank {what} has {t.shape[1]} rows, expected {rows}")
            return t.data_ptr(), t.stride(0) * t.element_size(), t.stride(1) * t.element_size()

        H, I = self.H, self.I
        if self.fmt == "ggml":
            return self._make_ggml_desc(geom)
        fp8 = self.fmt == "fp8"
        gw = geom(b[gk], 2 * I, gk)
        gs = geom(b[gsk] if gsk else None, -(-2 * I // 128) if fp8 else 2 * I, gsk)
        dw = geom(b[dk], H, dk)
        ds = geom(b[dsk] if dsk else None, -(-H // 128) if fp8 else H, dsk)
        group = get_format(self.fmt).group
        in_gu, in_dn = b[gk].shape[2] * group, b[dk].shape[2] * group
        if in_gu != H or in_dn != I:
            raise ValueError(f"banks have inputs ({in_gu}, {in_dn}), expected hidden {H}, intermediate {I}")
        gb, db = self._bias.get("gate_up_bias"), self._bias.get("down_bias")
        return kernels.Desc(
            get_format(self.fmt).code, ACTIVATIONS[self.activation], H, I, self.alpha, self.limit, n,
            *gw, *gs, *dw, *ds,
            gb.data_ptr() if gb is not None else None, db.data_ptr() if db is not None else None)

    def _make_ggml_desc(self, geom) -> kernels.Desc:
        """ggml banks: the 'scales' of the descriptor are the int32 type arrays, one entry per
        `rs` rows (gate_up_types: I rows per type, gate then up; down: all H rows); the up rows
        are a bank of their own (`up_w`), at their own row width."""
        b, H, I = self.banks, self.H, self.I
        types = check_ggml_banks(b, H, I)
        if not types <= set(KERNEL_TYPES):
            raise NotImplementedError(f"no CPU kernel for ggml types {sorted(type_name(t) for t in types - set(KERNEL_TYPES))}")
        gut, dnt = b["gate_up_types"], b["down_types"]
        for t, name in ((gut, "gate_up_types"), (dnt, "down_types")):
            if t.device.type != "cpu" or not t.is_contiguous():
                raise ValueError(f"bank {name} must be a contiguous CPU tensor")
        gb, db = self._bias.get("gate_up_bias"), self._bias.get("down_bias")
        return kernels.Desc(
            get_format("ggml").code, ACTIVATIONS[self.activation], H, I, self.alpha, self.limit, b["gate"].shape[0],
            *geom(b["gate"], I, "gate"), gut.data_ptr(), 8, I,
            *geom(b["down"], H, "down"), dnt.data_ptr(), 4, H,
            gb.data_ptr() if gb is not None else None, db.data_ptr() if db is not None else None,
            *geom(b["up"], I, "up"))

    def run(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor,
            out: torch.Tensor | None = None, rank: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, H] float32/bf16; expert_ids [T, K] int64 flat ids (< 0: skip); weights [T, K].
        Returns float32 [T, H] = sum_k weights[t,k] * expert_{ids[t,k]}(x[t]); adds into `out`.
        Each token's outputs are summed in ascending id, or ascending `rank` ([T, K] int64, one
        value per expert: the disk tier's flat ids of its slots) where given: C kernel only,
        and no torch GEMM split (`ranks`)."""
        T = x.shape[0]
        if out is None:
            out = torch.zeros(T, self.H, dtype=torch.float32)
        elif out.dtype != torch.float32 or not out.is_contiguous() or out.shape != (T, self.H):
            raise ValueError("out must be a contiguous float32 [T, H] tensor")
        if expert_ids.numel() == 0:
            return out
        ids = expert_ids if expert_ids.dtype == torch.int64 else expert_ids.long()
        w = weights if weights.dtype == torch.float32 else weights.float()
        if rank is not None and (rank.shape != ids.shape or rank.dtype != torch.int64 or not self.ranks(ids.numel())):
            raise ValueError("rank must be int64 like expert_ids, on the C kernel without the GEMM split")
        if self.lib is None:
            return run_experts(self.banks, self.spec, ids, x, w, out, dtype=torch.float32)
        self.last_experts = 0       # distinct experts this call ran (the expert-memory stats)
        if self.gemm_tokens and ids.numel() >= self.gemm_tokens and not (self.fmt == "bf16" and self.lib.ft_get_gemm(0)):
            ids = self._split_big(x, ids, w, out)   # (bf16 under the GEMM tiles: the kernel runs big groups itself)
        if x.dtype not in (torch.float32, torch.bfloat16):
            x = x.float()
        x, ids, w = x.contiguous(), ids.contiguous(), w.contiguous()
        if rank is not None:
            rank = rank.contiguous()
        with self._pool.lock:
            rc = self.lib.ft_moe_run_ranked(self._pool.handle, ctypes.byref(self._desc), x.data_ptr(),
                                            0 if x.dtype == torch.float32 else 1, T, ids.shape[1], ids.data_ptr(),
                                            None if rank is None else rank.data_ptr(), w.data_ptr(), out.data_ptr())
        if rc == -1:
            raise IndexError("expert id out of range of the banks")
        if rc < 0:
            raise MemoryError("CPU expert kernel could not allocate its scratch memory")
        self.last_experts += rc
        return out

    def decode(self, x: torch.Tensor, logits: torch.Tensor, top_k: int, norm: bool, after: bool, offset: int,
               ids: torch.Tensor, flat: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None = None
               ) -> torch.Tensor:
        """A decode step's routing and experts in one C call (`ft_moe_decode`): the top-k of
        `logits` (fp32 [T, E], as `SparseMoE.route`'s kernel path) into `ids` / `w` (contiguous
        int64 / fp32, T * top_k each), ids + `offset` (this executor's flat ids) into `flat`,
        then `run` of them into a new float32 [T, H]; with `residual` (contiguous fp32 [T, H])
        `residual + run` instead (`ft_moe_decode_add`: the experts' sum in a reused scratch).
        C kernel only, T * top_k <= 64."""
        T, E = logits.shape
        if x.dtype not in (torch.float32, torch.bfloat16):
            x = x.float()
        x = x.contiguous()
        out = torch.empty(T, self.H, dtype=torch.float32)
        if residual is not None:
            scratch = self._sums.get(T)
            if scratch is None:
                scratch = self._sums[T] = torch.empty(T, self.H, dtype=torch.float32)
            with self._pool.lock:
                rc = self.lib.ft_moe_decode_add(self._pool.handle, self._desc_ref, logits.data_ptr(), E, top_k,
                                                int(norm), int(after), offset, x.data_ptr(),
                                                0 if x.dtype == torch.float32 else 1, T, ids.data_ptr(),
                                                flat.data_ptr(), w.data_ptr(), scratch.data_ptr(),
                                                residual.data_ptr(), out.data_ptr())
        else:
            with self._pool.lock:
                rc = self.lib.ft_moe_decode(self._pool.handle, self._desc_ref, logits.data_ptr(), E, top_k,
                                            int(norm), int(after), offset, x.data_ptr(),
                                            0 if x.dtype == torch.float32 else 1, T, ids.data_ptr(), flat.data_ptr(),
                                            w.data_ptr(), out.data_ptr())
        if rc == -1:
            raise IndexError("expert id out of range of the banks")
        if rc < 0:
            raise MemoryError("CPU expert kernel could not allocate its scratch memory")
        self.last_experts = rc
        return out

    def decode_row_args(self, logits: torch.Tensor, top_k: int, norm: bool, after: bool, offset: int, x: torch.Tensor,
                        ids: torch.Tensor, flat: torch.Tensor, w: torch.Tensor, residual: torch.Tensor,
                        out: torch.Tensor) -> tuple:
        """(library, pool lock, arguments but the last) of `decode(x, logits, ..., residual)`'s
        call for one row as `ft_moe_row` takes them (the last: the per-expert counters), into
        `out` (fp32 [1, H]) instead of a new tensor: a caller whose operands never move makes the
        call itself every step (experts/execution/decode_row.py). C kernel only; x, logits,
        residual fp32 contiguous, ids / flat / w `top_k` long."""
        scratch = self._sums.get(1)
        if scratch is None:
            scratch = self._sums[1] = torch.empty(1, self.H, dtype=torch.float32)
        return self.lib, self._pool.lock, (
            self._pool.handle, self._desc_ref, logits.data_ptr(), logits.shape[1], top_k, int(norm), int(after),
            offset, x.data_ptr(), 0, ids.data_ptr(), flat.data_ptr(), w.data_ptr(), scratch.data_ptr(),
            residual.data_ptr(), out.data_ptr())

    def run_pairs(self, x: torch.Tensor, expert_ids: torch.Tensor, y: torch.Tensor) -> None:
        """Each routed pair's output apart: y [T*K, H] float32, row t*K+k = expert ids[t,k] on
        x[t] (unweighted, bias included; rows of ids < 0 untouched). The caller fills y with
        -0.0 first, so each row is the expert's output exactly; `combine` then sums them as
        `run` with a rank would. C kernel only (`ranks`)."""
        T, K = expert_ids.shape
        if not self.ranks(expert_ids.numel()) or y.dtype != torch.float32 or not y.is_contiguous() \
                or y.shape != (T * K, self.H):
            raise ValueError("run_pairs needs the C kernel and a contiguous float32 [T*K, H] y")
        if x.dtype not in (torch.float32, torch.bfloat16):
            x = x.float()
        x, ids = x.contiguous(), expert_ids.long().contiguous()
        with self._pool.lock:
            rc = self.lib.ft_moe_run_pairs(self._pool.handle, ctypes.byref(self._desc), x.data_ptr(),
                                           0 if x.dtype == torch.float32 else 1, T, K, ids.data_ptr(), y.data_ptr())
        if rc == -1:
            raise IndexError("expert id out of range of the banks")
        if rc < 0:
            raise MemoryError("CPU expert kernel could not allocate its scratch memory")

    def combine(self, ids: torch.Tensor, rank: torch.Tensor, weights: torch.Tensor, y: torch.Tensor,
                out: torch.Tensor) -> None:
        """out[t] += weights[t,k] * y[t*K+k] over the pairs with ids >= 0, each token's in
        ascending `rank`: the sum `run(..., rank=rank)` adds, bit for bit, from `run_pairs` rows."""
        T, K = ids.shape
        ids, rank = ids.long().contiguous(), rank.long().contiguous()
        w = weights.float().contiguous()
        if out.dtype != torch.float32 or not out.is_contiguous() or out.shape != (T, self.H) or rank.shape != ids.shape:
            raise ValueError("combine needs a contiguous float32 [T, H] out and a rank like ids")
        self.lib.ft_moe_combine(T, K, self.H, y.data_ptr(), ids.data_ptr(), rank.data_ptr(), w.data_ptr(),
                                out.data_ptr())

    def ranks(self, pairs: int) -> bool:
        """Whether a call of `pairs` routed (token, expert) pairs may take a `rank`: the C kernel
        runs all of it (no experts split off to torch ahead of the others)."""
        return self.lib is not None and not (self.gemm_tokens and pairs >= self.gemm_tokens
                                             and not (self.fmt == "bf16" and self.lib.ft_get_gemm(0)))

    def _split_big(self, x, ids, w, out) -> torch.Tensor:
        """Run experts with >= gemm_tokens tokens through torch; returns ids with those masked."""
        flat = ids.reshape(-1)
        counts = torch.bincount(flat.clamp_min(0), minlength=1)
        counts[0] -= int((flat < 0).sum())
        big = counts >= self.gemm_tokens
        if not bool(big.any()):
            return ids
        self.last_experts = int(big.sum())
        run_experts(self.banks, self.spec, ids, x, w, out, dtype=torch.float32,
                    tokens_min=self.gemm_tokens, dequant=self._dequantize)
        return torch.where((flat >= 0) & big[flat.clamp_min(0)], -1, flat).reshape(ids.shape)

    def _dequantize(self, fid: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up [2I, H], down [H, I]) of expert `fid` in fp32 by the C kernels, into buffers
        reused across calls (torch's dequantization of int8/mxfp4/fp8 is several passes)."""
        d, I, H = self._desc, self.I, self.H
        if self._deq is None:
            self._deq = (torch.empty(2 * I, H), torch.empty(H, I))
        gu, dn = self._deq
        parts = [((d.gu_w, d.gu_w_es, d.gu_w_rs, d.gu_s, d.gu_s_es, d.gu_s_rs), gu, H),
                 ((d.dn_w, d.dn_w_es, d.dn_w_rs, d.dn_s, d.dn_s_es, d.dn_s_rs), dn, I)]
        if d.up_w:      # the up rows in their own bank: gate and up in turn, their types 4 bytes apart
            parts[:1] = [((d.gu_w, d.gu_w_es, d.gu_w_rs, d.gu_s, d.gu_s_es, d.gu_s_rs), gu[:I], H),
                         ((d.up_w, d.up_w_es, d.up_w_rs, d.gu_s + 4, d.gu_s_es, d.gu_s_rs), gu[I:], H)]
        with self._pool.lock:
            for (wp, wes, wrs, sp, ses, srs), buf, cols in parts:
                self.lib.ft_dequant_rows(self._pool.handle, d.fmt, wp + fid * wes, wrs,
                                         sp + fid * ses if sp else None, srs, buf.shape[0], cols, buf.data_ptr())
        return self._deq

    def park(self) -> None:
        """The pool's idle workers sleep now (the caller blocks on a read; kernels/pool.py)."""
        if self._pool is not None:
            self._pool.park()

    def close(self) -> None:
        if self._pool is not None and self._own_pool:
            self._pool.close()
        self._pool = None
