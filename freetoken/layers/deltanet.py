"""Gated DeltaNet (Qwen3-Next, Qwen3.5): linear attention with a recurrent state.

Plain torch, no triton. Two equivalent forms of the gated delta rule:
  recurrent: one token at a time (decode),
  chunked:   UT-transform over chunks of 64 tokens (prefill).
Both take and return the recurrent state, so a sequence can stop and resume
anywhere. The causal depthwise conv keeps its last K-1 inputs as conv state.

Layouts: q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv];
recurrent state [B, Hv, Dk, Dv] (always fp32); conv state [B, C, K-1].
"""

import torch
import torch.nn.functional as F

from ..errors import CheckpointError
from .linear import LinearFactory


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _prepare(q, k, v, g, beta):
    hk, hv = k.shape[2], v.shape[2]
    if hk != hv:
        q = q.repeat_interleave(hv // hk, dim=2)
        k = k.repeat_interleave(hv // hk, dim=2)
    q, k, v, g, beta = (x.transpose(1, 2).float().contiguous() for x in (q, k, v, g, beta))
    q, k = l2norm(q), l2norm(k)
    q = q * q.shape[-1] ** -0.5
    return q, k, v, g, beta


def recurrent_gated_delta_rule(q, k, v, g, beta, state=None):
    """Token-by-token gated delta rule. Returns (out [B, T, Hv, Dv], state)."""
    dtype = q.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    b, h, t, dk = k.shape
    dv = v.shape[-1]
    s = torch.zeros(b, h, dk, dv, dtype=torch.float32, device=v.device) if state is None else state.float()
    out = torch.empty(b, h, t, dv, dtype=torch.float32, device=v.device)
    for i in range(t):                   # mat-vec products, one owned state updated in place
        s = (s * g[:, :, i].exp()[..., None, None]).contiguous()
        k_t = k[:, :, i].unsqueeze(-1)                                   # [B, H, Dk, 1]
        delta = (v[:, :, i] - (k_t.transpose(-1, -2) @ s).squeeze(-2)) * beta[:, :, i, None]
        s.view(b * h, dk, dv).baddbmm_(k_t.reshape(b * h, dk, 1), delta.reshape(b * h, 1, dv))
        out[:, :, i] = (q[:, :, i].unsqueeze(-2) @ s).squeeze(-2)
    return out.transpose(1, 2).to(dtype), s


def chunk_gated_delta_rule(q, k, v, g, beta, state=None, chunk_size: int = 64):
    """Chunked gated delta rule (prefill). Same contract as the recurrent form."""
    dtype = q.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    b, h, t, dk = k.shape
    dv = v.shape[-1]
    c = chunk_size
    pad = (c - t % c) % c
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    n = (t + pad) // c

    k_beta = (k * beta[..., None]).view(b, h, n, c, dk)
    v_beta = (v * beta[..., None]).view(b, h, n, c, dv)
    q, k = q.view(b, h, n, c, dk), k.view(b, h, n, c, dk)
    cum = g.view(b, h, n, c).cumsum(-1)

    upper = torch.ones(c, c, dtype=torch.bool, device=q.device).triu(1)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, float("-inf")).exp()
    ut = (k_beta @ k.transpose(-1, -2)) * decay
    intra = (q @ k.transpose(-1, -2)) * decay
    u = torch.linalg.solve_triangular(ut, v_beta, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(ut, k_beta * cum.exp()[..., None], upper=False, unitriangular=True)

    q = q * cum.exp()[..., None]
    k = k * (cum[..., -1:] - cum).exp()[..., None]
    chunk_decay = cum[..., -1].exp()[..., None, None]

    s = torch.zeros(b, h, dk, dv, dtype=torch.float32, device=v.device) if state is None else state.float()
    out = torch.empty(b, h, n, c, dv, dtype=torch.float32, device=v.device)
    for i in range(n):
        v_new = u[:, :, i] - w[:, :, i] @ s
        out[:, :, i] = q[:, :, i] @ s + intra[:, :, i] @ v_new
        s = s * chunk_decay[:, :, i] + k[:, :, i].transpose(-1, -2) @ v_new
    out = out.view(b, h, n * c, dv)[:, :, :t]
    return out.transpose(1, 2).contiguous().to(dtype), s


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor | None = None):
    """Depthwise causal conv + SiLU. x [B, C, T], weight [C, K], state [B, C, K-1].
    Returns (out [B, C, T], new_state [B, C, K-1])."""
    kw = weight.shape[-1]
    if state is None:
        state = x.new_zeros(x.shape[0], x.shape[1], kw - 1)
    full = torch.cat([state.to(x.dtype), x], dim=-1)
    t = x.shape[-1]
    # K shifted multiply-adds in float32: torch's depthwise conv1d has no fast bf16 CPU kernel
    f, w = full.float(), weight.float()
    out = f[:, :, :t] * w[:, 0, None]
    for j in range(1, kw):
        out.addcmul_(f[:, :, j:j + t], w[:, j, None])
    return F.silu(out).to(x.dtype), full[:, :, full.shape[-1] - (kw - 1):].contiguous()


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * xf.to(dtype) * F.silu(gate.float())).to(dtype)


class GatedDeltaNet:
    """The whole linear-attention token mixer of Qwen3-Next / Qwen3.5.

    One fused input projection, rows ordered [q | k | v | z | b | a] with heads
    contiguous (Qwen3.5 layout; Qwen3-Next's grouped qkvz/ba are regrouped into it
    at load by `qwen3_next_in_proj`)."""

    def __init__(self, in_proj, conv_weight, dt_bias, A_log, norm_weight, out_proj,
                 num_k_heads: int, head_k_dim: int, head_v_dim: int, eps: float):
        self.in_proj, self.conv_weight, self.out_proj = in_proj, conv_weight, out_proj
        self.dt_bias, self.A_log, self.norm_weight = dt_bias, A_log, norm_weight
        self.hv = dt_bias.shape[0]
        self.hk, self.dk, self.dv, self.eps = num_k_heads, head_k_dim, head_v_dim, eps
        self.key_dim, self.value_dim = num_k_heads * head_k_dim, self.hv * head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.conv_kernel = conv_weight.shape[-1]

    @classmethod
    def load(cls, get, cfg: dict, linear: LinearFactory, device="cpu") -> "GatedDeltaNet":
        """`get(name)` returns this layer's tensor `linear_attn.<name>`; both the Qwen3.5
        (in_proj_qkv/z/b/a) and the Qwen3-Next (in_proj_qkvz/ba) layouts are accepted;
        `linear` builds the projections."""
        hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
        dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
        try:
            in_proj = torch.cat([get("in_proj_qkv.weight"), get("in_proj_z.weight"),
                                 get("in_proj_b.weight"), get("in_proj_a.weight")])
        except (KeyError, CheckpointError):
            in_proj = qwen3_next_in_proj(get("in_proj_qkvz.weight"), get("in_proj_ba.weight"), hk, hv, dk, dv)
        conv = get("conv1d.weight")
        conv = conv.reshape(conv.shape[0], conv.shape[-1])
        t = lambda x, dt=linear.compute_dtype: x.to(dt).to(device).contiguous()
        lin = lambda x: linear(t(x, linear.storage_dtype))  # noqa: E731
        return cls(lin(in_proj), t(conv), t(get("dt_bias"), torch.float32), t(get("A_log"), torch.float32),
                   t(get("norm.weight")), lin(get("out_proj.weight")), hk, dk, dv, cfg.get("rms_norm_eps", 1e-6))

    @staticmethod
    def state_shapes(cfg: dict) -> tuple[tuple, tuple]:
        """(conv, recurrent) state shapes of one layer, from the config alone."""
        hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
        dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
        return (2 * hk * dk + hv * dv, cfg.get("linear_conv_kernel_dim", 4) - 1), (hv, dk, dv)

    @property
    def conv_state_shape(self):
        return (self.conv_dim, self.conv_kernel - 1)

    @property
    def rec_state_shape(self):
        return (self.hv, self.dk, self.dv)

    def __call__(self, x: torch.Tensor, conv_state=None, rec_state=None):
        """x [B, T, hidden] -> (out [B, T, hidden], conv_state, rec_state).
        T == 1 uses the recurrent form, longer inputs the chunked one."""
        bsz, t, _ = x.shape
        proj = self.in_proj(x)
        qkv, z, b, a = proj.split([self.conv_dim, self.value_dim, self.hv, self.hv], dim=-1)
        qkv, conv_state = causal_conv1d(qkv.transpose(1, 2), self.conv_weight, conv_state)
        q, k, v = qkv.transpose(1, 2).split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(bsz, t, self.hk, self.dk)
        k = k.reshape(bsz, t, self.hk, self.dk)
        v = v.reshape(bsz, t, self.hv, self.dv)
        beta = b.sigmoid()
        g = -self.A_log.exp() * F.softplus(a.float() + self.dt_bias)
        rule = recurrent_gated_delta_rule if t == 1 else chunk_gated_delta_rule
        o, rec_state = rule(q, k, v, g, beta, rec_state)
        o = gated_rms_norm(o, z.reshape(bsz, t, self.hv, self.dv), self.norm_weight, self.eps)
        return self.out_proj(o.reshape(bsz, t, self.value_dim)), conv_state, rec_state


def qwen3_next_in_proj(qkvz: torch.Tensor, ba: torch.Tensor, hk: int, hv: int, dk: int, dv: int):
    """Qwen3-Next groups q,k,v,z (and b,a) per key head; regroup rows into [q|k|v|z|b|a]."""
    r = hv // hk
    hidden = qkvz.shape[-1]
    q, k, v, z = qkvz.view(hk, 2 * dk + 2 * r * dv, hidden).split([dk, dk, r * dv, r * dv], dim=1)
    b, a = ba.view(hk, 2 * r, hidden).split([r, r], dim=1)
    return torch.cat([x.reshape(-1, hidden) for x in (q, k, v, z, b, a)])
