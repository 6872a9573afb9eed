"""llama.cpp's CPU arithmetic, bit for bit, in torch (`ggml_numerics="llama-exact"`).

Two engines that both round activations to int8 per 32 agree only as closely as their rounding
decisions coincide: a value one float32 ulp apart from llama.cpp's can round to the other int8
code, and that difference grows through the next layers' roundings as large as the rounding
itself (measured on SmolLM2: ~1e-2 relative at layer 2). So this module reproduces each op of
llama.cpp's CPU graph (ggml-cpu of llama-cpp-python 0.3.36, AVX512 build, flash attention off)
with its own float32 rounding steps and summation order, checked op by op against that build's
tensors (bench/llamacpp_dump.py) to the bit:
  - quantize_row_q8_1 (x86): q = round-half-even(x * (127 / amax)), d = amax / 127 and
    s = d * sum(q) stored in fp16 (the scale's inverse is 127 / amax, not 1 / d: the first op
    where FreeToken's earlier emulation parted from llama.cpp);
  - ggml_vec_dot_q4_1_q8_1 (AVX2 loop): 8 int32 lanes of 4 products per block, acc = fma(d_w d_x,
    lane, acc) over blocks, a halving sum of the 8 lanes, plus the mins' fma chain m * s;
  - f16 K/V/Q and softmax probabilities, with llamafile's tinyBLAS f16 GEMM order for K Q and
    V P in a batch (16 lanes accumulated over the reduction in order, then a halving sum of the
    lanes) and ggml_vec_dot_f16's in a one-token step (4 accumulators of 16 lanes);
  - ggml_v_expf (the AVX512 polynomial) in soft_max (per-16 halving sums added in double, scaled
    by float(1 / sum)) and in SiLU (x / (1 + expf(-x)));
  - rms_norm: float32 squares summed in double, scale = 1 / sqrtf(mean + eps), (x * scale) * w;
  - rope (normal = NeoX halves on un-permuted rows): glibc cosf/sinf of theta, theta *= powf(base,
    -2/dim) per pair, out = fma(x0, cos, -(x1 sin)), fma(x0, sin, x1 cos).
An fma is emulated in float64 (a float32 product is exact there; one rounding to float32 after)."""
from __future__ import annotations

import ctypes
import ctypes.util
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from . import ggml_quants as gq

_EXP = {k: float.fromhex(v) for k, v in dict(
    log2e="0x1.715476p+0", shift="0x1.8p23", ln2hi="0x1.62e4p-1", ln2lo="0x1.7f7d1cp-20", c5="0x1.0e4020p-7",
    c4="0x1.573e2ep-5", c3="0x1.555e66p-3", c2="0x1.fffdb6p-2", c1="0x1.ffffecp-1").items()}
_EXP_T = {k: torch.tensor(v, dtype=torch.float32) for k, v in _EXP.items()}
_INF, _ONE, _ZERO = torch.tensor(float("inf")), torch.tensor(1.0), torch.tensor(0.0)
LANES = 16          # ggml's f16 vectors (AVX512): K Q and V P sum 16 lanes, then halve


def fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 fma(a, b, c): one rounding (a * b is exact in float64)."""
    return (a.double() * b.double() + c.double()).float()


def halving_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum of the last dim (a power of 2) as _mm512_reduce_add_ps / hsum_float_8: first half + second half, repeated."""
    while x.shape[-1] > 1:
        h = x.shape[-1] // 2
        x = x[..., :h] + x[..., h:]
    return x[..., 0]


def _div(a: float, t: torch.Tensor) -> torch.Tensor:
    """a / t rounded once to t's dtype (torch computes `a / t` as a * reciprocal(t); float64
    then float32 rounds a float32 quotient correctly)."""
    return (torch.full_like(t, a, dtype=torch.float64) / t.double()).to(t.dtype)


def f16(x: torch.Tensor) -> torch.Tensor:
    return x.half().float()


def v_expf(x: torch.Tensor) -> torch.Tensor:
    """ggml_v_expf (ggml-cpu vec.h, AVX512): exp(x) as llama.cpp's softmax and SiLU compute it."""
    c = _EXP_T
    z = fma(x, c["log2e"], c["shift"])
    n = z - c["shift"]
    b = fma(-n, c["ln2lo"], fma(-n, c["ln2hi"], x))
    u = b * b
    j = fma(fma(fma(c["c5"], b, c["c4"]), u, fma(c["c3"], b, c["c2"])), u, fma(c["c1"], b, _ONE))
    return torch.where(n.abs() > 192, torch.where(n > 0, _INF, _ZERO), torch.ldexp(j, n))   # inf or 0 (ggml's slow path)


def silu(x: torch.Tensor) -> torch.Tensor:
    """ggml_v_silu: x / (1 + expf(0 - x))."""
    return (x.double() / (1 + v_expf(0 - x)).double()).float()


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """ggml_compute_forward_rms_norm_f32 then the MUL by the weight."""
    x = x.float()
    mean = ((x * x).double().cumsum(-1)[..., -1:] / x.shape[-1]).float()      # summed in order, as ggml
    root = torch.sqrt((mean + torch.tensor(eps, dtype=torch.float32)).double()).float()   # sqrtf (torch's float32
    scale = _div(1, root)                                                                     # sqrt is not always)
    return (x * scale) * w.float()


def q8_1(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """quantize_row_q8_1 of x [T, K]: (codes [T, K / 32, 32] as floats, fp16 d [T, K / 32], fp16 s)."""
    b = x.float().unflatten(-1, (-1, 32))
    amax = b.abs().amax(-1, keepdim=True)
    d = amax / 127
    q = torch.round(b * torch.where(amax > 0, _div(127, amax), torch.zeros_like(amax)))
    return q, f16(d[..., 0]), f16(d[..., 0] * q.sum(-1))


class Q41Rows:
    """Q4_1 rows [N, K] split for the exact dot: codes int8 [N, K / 32, 32], fp16 d and m as float32."""

    def __init__(self, rows: torch.Tensor, cols: int):
        nb = cols // 32
        raw = rows[:, :nb * 20].reshape(rows.shape[0], nb, 20)
        self.d = raw[..., 0:2].contiguous().view(torch.float16)[..., 0].float()
        self.m = raw[..., 2:4].contiguous().view(torch.float16)[..., 0].float()
        qs = raw[..., 4:].to(torch.int16)
        self.q = torch.cat([qs & 15, qs >> 4], -1).to(torch.int8).contiguous()


def q4_1_matmul(x: torch.Tensor, w: Q41Rows, lib=None, threads: int = 1) -> torch.Tensor:
    """x [T, K] @ W^T as ggml_vec_dot_q4_1_q8_1 sums it, per output (T, N): by the C kernel
    (kernels/c/ggml_exact.c, N split over `threads` calls) when `lib` is given, else in torch."""
    if lib is not None:
        return _q4_1_c(x, w, lib, threads)
    q, dx, sx = q8_1(x)
    T, nb = q.shape[:2]
    N = w.q.shape[0]
    acc = torch.zeros(T, N, 8, dtype=torch.float64)
    summs = torch.zeros(T, N, dtype=torch.float64)
    for b in range(nb):
        qx = q[:, b].reshape(T, 8, 4).transpose(0, 1)                       # [8, T, 4]
        qw = w.q[:, b].float().reshape(N, 8, 4).permute(1, 2, 0)             # [8, 4, N]
        lanes = torch.bmm(qx, qw).permute(1, 2, 0).double()                 # [T, N, 8], exact integers
        dd = (w.d[:, b][None] * dx[:, b][:, None]).double()                 # float32 product d_w * d_x
        acc = (dd[..., None] * lanes + acc).float().double()
        summs = (w.m[:, b][None].double() * sx[:, b][:, None].double() + summs).float().double()
    return halving_sum(acc.float()) + summs.float()


def _q4_1_c(x: torch.Tensor, w: Q41Rows, lib, threads: int) -> torch.Tensor:
    q, dx, sx = q8_1(x)
    T, nb = q.shape[:2]
    N = w.q.shape[0]
    qx, dx, sx = q.to(torch.int8).contiguous(), dx.contiguous(), sx.contiguous()
    y = torch.empty(T, N, dtype=torch.float32)
    cuts = [N * i // threads for i in range(threads + 1)]
    call = lambda a, b: lib.ft_q4_1_exact(qx.data_ptr(), dx.data_ptr(), sx.data_ptr(), T, w.q.data_ptr(),  # noqa: E731
                                          w.d.data_ptr(), w.m.data_ptr(), a, b, nb, y.data_ptr(), N)
    if threads == 1 or T == 1:              # a one-token step: a thread hand-off costs more than the rows
        call(0, N)
    else:                                   # ctypes lets go of the GIL: the slices run side by side
        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(call, cuts[:-1], cuts[1:]))
    return y


def supported(parts) -> bool:
    """True when every part of a ggml layer is Q4_1 (the types this module sums exactly)."""
    return all(p.type == gq.Q4_1 for p in parts)


def dot16(a: torch.Tensor, b: torch.Tensor, lib=None, vec_dot: bool = False) -> torch.Tensor:
    """a [M, K] x b [N, K] -> [M, N] summed as ggml sums f16 dots (kernels/c/ggml_exact.c with
    `lib`): tinyBLAS's GEMM (lane l adds products l, l + 16, ... in order) or, `vec_dot`,
    ggml_vec_dot_f16 (4 accumulators over 64 at a time, then (0 + 2) + (1 + 3)); both then
    halve the 16 lanes. K a multiple of 64."""
    if lib is not None:
        a, b = a.float().contiguous(), b.float().contiguous()
        out = torch.empty(a.shape[0], b.shape[0], dtype=torch.float32)
        lib.ft_dot16_exact(a.data_ptr(), a.shape[1], b.data_ptr(), b.shape[1], a.shape[0], b.shape[0], a.shape[1],
                           out.data_ptr(), out.shape[1], int(vec_dot))
        return out
    n_acc = 4 if vec_dot else 1
    acc = [None] * n_acc
    for c in range(0, a.shape[-1], LANES * n_acc):
        for j in range(n_acc):
            o = c + LANES * j
            p = a[:, None, o:o + LANES] * b[None, :, o:o + LANES]           # f16 x f16: exact in float32
            acc[j] = p if acc[j] is None else acc[j] + p
    return halving_sum((acc[0] + acc[2]) + (acc[1] + acc[3]) if vec_dot else acc[0])


def soft_max(scores: torch.Tensor, visible: torch.Tensor, scale: float) -> torch.Tensor:
    """ggml soft_max of scores [..., K] (K a multiple of 16) with a -inf mask where not visible."""
    w = (scores * torch.tensor(scale, dtype=torch.float32)).masked_fill(~visible, float("-inf"))
    e = v_expf(w - w.amax(-1, keepdim=True)).masked_fill(~visible, 0)
    total = halving_sum(e.unflatten(-1, (-1, LANES))).double().sum(-1, keepdim=True)
    return e * _div(1, total).float()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float,
              lib=None, one_token_rows: bool = False) -> torch.Tensor:
    """q [B, Hq, Q, D], k/v [B, Hkv, K, D] (f16-rounded), visible [B, 1, Q, K] -> [B, Hq, Q, D]:
    llama.cpp's non-flash attention (kq, soft_max, kqv), one head at a time. A one-token step
    sums as ggml_vec_dot_f16 (llama.cpp's mul_mat leaves tinyBLAS there), a batch as tinyBLAS;
    `one_token_rows`: every row as its own one-token step (a verify of drafted tokens, which
    llama.cpp would have decoded one at a time)."""
    B, Hq, Q, D = q.shape
    K = k.shape[2]
    pad = -K % (4 * LANES)
    one = Q == 1 or one_token_rows
    k, v = (torch.nn.functional.pad(t.float(), (0, 0, 0, pad)) for t in (k, v))
    visible = torch.nn.functional.pad(visible, (0, pad), value=False)
    group = Hq // k.shape[1]
    out = torch.empty(B, Hq, Q, D, dtype=torch.float32)
    for b in range(B):
        for h in range(Hq):
            p = soft_max(dot16(f16(q[b, h]), k[b, h // group], lib, one), visible[b, 0], scale)
            out[b, h] = dot16(f16(p), v[b, h // group].T.contiguous(), lib, one)
    return out


def _libm():
    lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    for name in ("cosf", "sinf"):
        getattr(lib, name).restype, getattr(lib, name).argtypes = ctypes.c_float, [ctypes.c_float]
    lib.powf.restype, lib.powf.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
    return lib


def rope_tables(positions: int, dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml_rope_cache_init's cos/sin [positions, dim / 2]: theta = p, then theta *= powf(base,
    -2 / dim) per pair, through the C library's cosf/sinf (llama.cpp calls them per value)."""
    lib = _libm()
    theta_scale = np.float32(lib.powf(base, np.float32(-2.0) / np.float32(dim)))
    theta = np.empty((positions, dim // 2), np.float32)
    theta[:, 0] = np.arange(positions, dtype=np.float32)
    for j in range(1, dim // 2):
        theta[:, j] = theta[:, j - 1] * theta_scale
    flat = theta.ravel().tolist()
    cos = np.fromiter((lib.cosf(t) for t in flat), np.float32, len(flat)).reshape(theta.shape)
    sin = np.fromiter((lib.sinf(t) for t in flat), np.float32, len(flat)).reshape(theta.shape)
    return torch.from_numpy(cos), torch.from_numpy(sin)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, H, D] (pairs (i, i + D/2), the un-permuted rows' NeoX halves), cos/sin [N, 1, D/2]."""
    h = x.shape[-1] // 2
    x0, x1 = x[..., :h].float(), x[..., h:].float()
    return torch.cat([fma(x0, cos, -(x1 * sin)), fma(x0, sin, x1 * cos)], -1)
