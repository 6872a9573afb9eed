"""Kimi delta attention (KDA, GLM-5.3-Flash's linear layers): the gated delta rule of
`deltanet.py` with a decay per key channel instead of one per head.

  S_t = diag(exp(g_t)) S_{t-1};  S_t += k_t (beta_t (v_t - S_t^T k_t))^T;  o_t = S_t^T q_t
with q, k L2-normalised (q also scaled by Dk^-0.5), g_t [Dk] <= 0, state S [Dk, Dv] per head.

Plain torch, no triton. `recurrent_kda` steps one token at a time (decode); `chunk_kda`
handles chunks of 32 tokens (prefill): the in-chunk decays exp(G_i - G_j) per channel are built
explicitly inside 16-token sub-chunks and factored into GEMMs against earlier sub-chunks around
a reference point, so every exponential is <= 1 and nothing overflows however fast the gates
decay. Both take and return the recurrent state, so a sequence can stop and resume anywhere.

Layouts: q, k, g [B, T, H, Dk]; v [B, T, H, Dv]; beta [B, T, H]; state [B, H, Dk, Dv] fp32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .deltanet import causal_conv1d, l2norm
from .linear import LinearFactory


def _prepare(q, k, v, g, beta):
    q, k, v, g, beta = (x.transpose(1, 2).float().contiguous() for x in (q, k, v, g, beta))
    q, k = l2norm(q), l2norm(k)
    return q * q.shape[-1] ** -0.5, k, v, g, beta


def _zeros_state(k, v, state):
    b, h, _, dk = k.shape
    return torch.zeros(b, h, dk, v.shape[-1], dtype=torch.float32, device=v.device) if state is None \
        else state.float().clone()


def recurrent_kda(q, k, v, g, beta, state=None):
    """Token-by-token KDA. Returns (out [B, T, H, Dv], state)."""
    dtype = q.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    s = _zeros_state(k, v, state)
    out = torch.empty(*v.shape, dtype=torch.float32, device=v.device)
    for t in range(k.shape[2]):
        s.mul_(g[:, :, t].exp().unsqueeze(-1))
        k_t = k[:, :, t].unsqueeze(-1)                                        # [B, H, Dk, 1]
        delta = (v[:, :, t] - (k_t.transpose(-1, -2) @ s).squeeze(-2)) * beta[:, :, t, None]
        s.add_(k_t * delta.unsqueeze(-2))
        out[:, :, t] = (q[:, :, t].unsqueeze(-2) @ s).squeeze(-2)
    return out.transpose(1, 2).to(dtype), s


def _decayed_scores(q: torch.Tensor, k: torch.Tensor, cum: torch.Tensor, sub: int):
    """(A_qk, A_kk): A_x[i, j] = sum_d x_i[d] k_j[d] exp(G_i[d] - G_j[d]) for j <= i, else 0;
    q, k, cum [B, H, n, D] with G = cum non-increasing along n. Sub-chunks of `sub` rows: within
    one the decays are built explicitly; rows of sub-chunk I against earlier columns are one
    GEMM, x_i exp(G_i - r) . k_j exp(r - G_j) with r = G at the row before I (both <= 1)."""
    b, h, n, d = k.shape
    m = -(-n // sub)
    pad = m * sub - n
    if pad:       # padded rows/columns repeat the last cumulative decay: nothing grows, all discarded
        q, k = F.pad(q, (0, 0, 0, pad)), F.pad(k, (0, 0, 0, pad))
        cum = torch.cat([cum, cum[:, :, -1:].expand(b, h, pad, d)], dim=2)
    big = m * sub
    ks, cs = k.view(b, h, m, sub, d), cum.view(b, h, m, sub, d)
    tri = torch.ones(sub, sub, dtype=torch.bool, device=k.device).tril()
    diff = (cs.unsqueeze(-2) - cs.unsqueeze(-3)).masked_fill(~tri[:, :, None], float("-inf"))
    kd = ks.unsqueeze(-3) * diff.exp()                                           # [B, H, m, s, s, D]
    if m > 1:
        ref = cs[:, :, :-1, -1:]                                                  # [B, H, m-1, 1, D]
        before = torch.arange(big, device=k.device) < (torch.arange(1, m, device=k.device)[:, None] * sub)
        e = (ref - cum.unsqueeze(2)).masked_fill(~before[:, :, None], float("-inf"))
        k_ref = (k.unsqueeze(2) * e.exp()).transpose(-1, -2)                       # [B, H, m-1, D, big]
        row_decay = (cs[:, :, 1:] - ref).exp()
    result = []
    for x in (q, k):
        xs = x.view(b, h, m, sub, d)
        out = torch.zeros(b, h, m, sub, big, dtype=k.dtype, device=k.device)
        if m > 1:
            out[:, :, 1:] = (xs[:, :, 1:] * row_decay) @ k_ref
        diag = (xs.unsqueeze(-2) * kd).sum(-1)                                   # [B, H, m, s, s]
        blocks = out.view(b, h, m, sub, m, sub)
        for i in range(m):
            blocks[:, :, i, :, i] = diag[:, :, i]
        result.append(out.view(b, h, big, big)[:, :, :n, :n])
    return result


def chunk_kda(q, k, v, g, beta, state=None, chunk_size: int = 32, sub: int = 16):
    """Chunked KDA (prefill): per chunk a UT transform of the in-chunk delta rule, then one
    state update. Same contract as `recurrent_kda`."""
    dtype = q.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    t = k.shape[2]
    s = _zeros_state(k, v, state)
    out = torch.empty(*v.shape, dtype=torch.float32, device=v.device)
    for start in range(0, t, chunk_size):
        sl = slice(start, min(start + chunk_size, t))
        qi, ki, vi, bi = q[:, :, sl], k[:, :, sl], v[:, :, sl], beta[:, :, sl, None]
        cum = g[:, :, sl].cumsum(-2)                                            # [B, H, n, Dk]
        a_qk, a_kk = _decayed_scores(qi, ki, cum, sub)                           # diagonal included
        a_kk = a_kk * bi                                                         # only the strict lower part is read
        decay = cum.exp()
        u = torch.linalg.solve_triangular(a_kk, vi * bi, upper=False, unitriangular=True)
        w = torch.linalg.solve_triangular(a_kk, ki * bi * decay, upper=False, unitriangular=True)
        v_new = u - w @ s
        out[:, :, sl] = (qi * decay) @ s + a_qk @ v_new
        last = cum[:, :, -1:]
        s = s * last.transpose(-1, -2).exp() + (ki * (last - cum).exp()).transpose(-1, -2) @ v_new
    return out.transpose(1, 2).to(dtype), s


def sigmoid_gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm per head in fp32, times sigmoid(gate) (KDA's output norm)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * xf * torch.sigmoid(gate.float())).to(x.dtype)


class KimiDeltaAttention:
    """The whole KDA token mixer: q/k/v projections (one fused matmul with the gates' low-rank
    inputs and beta), a causal depthwise conv + SiLU over [q | k | v], per-channel forget gate
    g = lb * sigmoid(exp(A_log) * (f_b(f_a(x)) + dt_bias)) (or -exp(A_log) * softplus(..)
    without a lower bound), beta = sigmoid(b_proj(x)), output RMSNorm gated by
    sigmoid(g_b(g_a(x))), o_proj. Conv and recurrent state have the gated DeltaNet's shapes."""

    def __init__(self, in_proj, f_b, g_b, conv_weight, dt_bias, A_log, norm_weight, out_proj,
                 heads: int, head_dim: int, eps: float, lower_bound: float | None):
        self.in_proj, self.f_b, self.g_b, self.out_proj = in_proj, f_b, g_b, out_proj
        self.conv_weight, self.dt_bias, self.A_log, self.norm_weight = conv_weight, dt_bias, A_log, norm_weight
        self.h, self.d, self.eps, self.lower_bound = heads, head_dim, eps, lower_bound
        self.qkv_dim = heads * head_dim
        self.conv_kernel = conv_weight.shape[-1]

    @classmethod
    def load(cls, get, cfg: dict, linear: LinearFactory, device="cpu") -> "KimiDeltaAttention":
        """`get(name)` returns this layer's tensor `self_attn.<name>` in the checkpoint's layout
        (`q_conv1d`/`k_conv1d`/`v_conv1d`, `f_a_proj`, `f_b_proj`, `dt_bias`, `A_log`, ...)."""
        h, d = cfg.get("linear_num_heads", 64), cfg.get("linear_head_dim", 128)
        t = lambda x, dt=linear.compute_dtype: x.to(dt).to(device).contiguous()  # noqa: E731
        lin = lambda x: linear(t(x, linear.storage_dtype))  # noqa: E731
        in_proj = torch.cat([get(f"{n}.weight") for n in ("q_proj", "k_proj", "v_proj", "f_a_proj", "g_a_proj",
                                                             "b_proj")])
        conv = torch.cat([get(f"{n}_conv1d.weight") for n in "qkv"])
        return cls(lin(in_proj), lin(get("f_b_proj.weight")), lin(get("g_b_proj.weight")),
                   t(conv.reshape(conv.shape[0], conv.shape[-1]), torch.float32), t(get("dt_bias"), torch.float32),
                   t(get("A_log"), torch.float32), t(get("o_norm.weight"), torch.float32), lin(get("o_proj.weight")),
                   h, d, cfg.get("rms_norm_eps", 1e-5), cfg.get("linear_lower_bound", -5.0))

    @staticmethod
    def state_shapes(cfg: dict) -> tuple[tuple, tuple]:
        """(conv, recurrent) state shapes of one layer, from the config alone."""
        h, d = cfg.get("linear_num_heads", 64), cfg.get("linear_head_dim", 128)
        return (3 * h * d, cfg.get("linear_conv_kernel_dim", 4) - 1), (h, d, d)

    @property
    def conv_state_shape(self):
        return (3 * self.qkv_dim, self.conv_kernel - 1)

    @property
    def rec_state_shape(self):
        return (self.h, self.d, self.d)

    def forget_gate(self, f: torch.Tensor) -> torch.Tensor:
        g = (f.float() + self.dt_bias).unflatten(-1, (self.h, self.d))
        rate = self.A_log.exp()[:, None]
        if self.lower_bound is not None:
            return self.lower_bound * torch.sigmoid(rate * g)
        return -rate * F.softplus(g, threshold=20.0)

    def __call__(self, x: torch.Tensor, conv_state=None, rec_state=None):
        """x [B, T, hidden] -> (out [B, T, hidden], conv_state, rec_state).
        T == 1 uses the recurrent form, longer inputs the chunked one."""
        bsz, t, _ = x.shape
        qkv, fa, ga, b = self.in_proj(x).split([3 * self.qkv_dim, self.d, self.d, self.h], dim=-1)
        qkv, conv_state = causal_conv1d(qkv.transpose(1, 2), self.conv_weight, conv_state)
        q, k, v = (y.reshape(bsz, t, self.h, self.d) for y in qkv.transpose(1, 2).split(self.qkv_dim, dim=-1))
        g = self.forget_gate(self.f_b(fa))
        rule = recurrent_kda if t == 1 else chunk_kda
        o, rec_state = rule(q, k, v, g, torch.sigmoid(b.float()), rec_state)
        o = sigmoid_gated_rms_norm(o, self.g_b(ga).reshape(bsz, t, self.h, self.d), self.norm_weight, self.eps)
        return self.out_proj(o.reshape(bsz, t, self.qkv_dim)), conv_state, rec_state
