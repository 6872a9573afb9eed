"""Rotary position embeddings with the scaling types of HF configs (default, linear,
dynamic below its threshold, llama3, yarn). cos/sin are precomputed in float32 for every
position up to the context length and cast to the model dtype, as transformers does."""
from __future__ import annotations

import math

import torch

from ..errors import UnsupportedModelError
from ..kernels import cpu_kernels
from .norm import RMSNorm


def rope_parameters(cfg: dict) -> dict:
    """Normalise old (`rope_theta` + `rope_scaling`) and new (`rope_parameters`) config styles."""
    params = dict(cfg.get("rope_parameters") or {})
    if "full_attention" in params and isinstance(params["full_attention"], dict):
        params = dict(params["full_attention"])
    scaling = cfg.get("rope_scaling") or {}
    for k, v in scaling.items():
        params.setdefault(k, v)
    params.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type", params.get("type", "default")) or "default"
    if "partial_rotary_factor" not in params and cfg.get("partial_rotary_factor") is not None:
        params["partial_rotary_factor"] = cfg["partial_rotary_factor"]
    if params["rope_type"] in ("llama3", "yarn"):
        params.setdefault("original_max_position_embeddings",
                          cfg.get("original_max_position_embeddings") or cfg.get("max_position_embeddings"))
    return params


def inv_freq_and_scale(params: dict, head_dim: int, max_position_embeddings: int) -> tuple[torch.Tensor, float, int]:
    """(inverse frequencies, attention scaling of cos/sin, rotary dim)."""
    base = float(params["rope_theta"])
    dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    kind = params["rope_type"]
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if kind in ("default", "dynamic"):
        return inv_freq, 1.0, dim
    if kind == "linear":
        return inv_freq / params["factor"], 1.0, dim
    if kind == "llama3":
        factor, lo, hi = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old = params["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old / lo, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        return torch.where(medium, smoothed, scaled), 1.0, dim
    if kind == "yarn":
        return _yarn(params, base, dim, max_position_embeddings) + (dim,)
    raise UnsupportedModelError(f"config.json: rope type {kind!r} is not supported "
                                "(expected default, linear, dynamic, llama3 or yarn)")


def _yarn(p: dict, base: float, dim: int, max_pos: int) -> tuple[torch.Tensor, float]:
    original = p["original_max_position_embeddings"]
    factor = p.get("factor") or max_pos / original

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = p.get("attention_factor")
    if attn is None:
        if p.get("mscale") and p.get("mscale_all_dim"):
            attn = float(mscale(factor, p["mscale"]) / mscale(factor, p["mscale_all_dim"]))
        else:
            attn = mscale(factor)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def correction_dim(rot):
        return (dim * math.log(original / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extra = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
    return inv, attn


class Rotary:
    """cos/sin tables for positions [0, max_len); `apply` rotates the first `dim` features."""

    def __init__(self, cfg: dict, head_dim: int, max_len: int, dtype: torch.dtype, device):
        params = rope_parameters(cfg)
        inv_freq, scale, self.dim = inv_freq_and_scale(params, head_dim, cfg.get("max_position_embeddings", max_len))
        pos = torch.arange(max_len, dtype=torch.float32)
        freqs = torch.outer(pos, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = (emb.cos() * scale).to(dtype).to(device)
        self.sin = (emb.sin() * scale).to(dtype).to(device)
        self.head_dim = head_dim

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos.index_select(0, positions).unsqueeze(1), self.sin.index_select(0, positions).unsqueeze(1)

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [N, heads, head_dim]; cos/sin from `tables` ([N, 1, dim])."""
        if x.dtype == torch.float32 and cos.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 3:
            lib = cpu_kernels()
            if lib is not None:   # one C call instead of ~8 small torch ops
                x, cos, sin = x.contiguous(), cos.contiguous(), sin.contiguous()
                out = torch.empty_like(x)
                lib.ft_rope(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), x.shape[0], x.shape[1], x.shape[2],
                            self.dim, out.data_ptr())
                return out
        if self.dim == self.head_dim:
            return x * cos + _rotate_half(x) * sin
        rot, rest = x[..., : self.dim], x[..., self.dim:]
        return torch.cat([rot * cos + _rotate_half(rot) * sin, rest], dim=-1)


def norm_rope_qk(qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int, rot: int, q_norm, k_norm,
                 cos: torch.Tensor, sin: torch.Tensor):
    """A few tokens' q and k, the leading columns of their fused projection rows qkv [n, (heads +
    2 * kv_heads) * head_dim] (fp32, CPU, contiguous; n = 1 a decode step, n = k + 1 a verify):
    the optional per-head RMSNorm (q_norm/k_norm: `norm.RMSNorm` or None) then the rotation of
    both in one buffer; one C call running the C code of `rms_norm` and `Rotary.apply` per row
    (so the same bits), instead of ~10 calls and views a layer. Returns (q [n, heads, head_dim],
    k [n, kv_heads, head_dim]), or None where this path does not apply."""
    lib = cpu_kernels()
    if (lib is None or qkv.dtype != torch.float32 or qkv.device.type != "cpu" or qkv.dim() != 2
            or not qkv.is_contiguous() or cos.dtype != torch.float32 or not cos.is_contiguous()
            or not sin.is_contiguous()):
        return None
    if q_norm is not None and not (_plain_norm(q_norm) and _plain_norm(k_norm)):
        return None
    n, h = qkv.shape[0], heads + kv_heads
    out = torch.empty(n, h, head_dim, dtype=torch.float32)
    qw, kw = (None, None) if q_norm is None else (q_norm.weight.data_ptr(), k_norm.weight.data_ptr())
    if lib.ft_norm_rope_qk(qkv.data_ptr(), qkv.stride(0), n, heads, kv_heads, head_dim, rot, qw,
                           q_norm.eps if q_norm is not None else 0.0, kw, k_norm.eps if k_norm is not None else 0.0,
                           cos.data_ptr(), sin.data_ptr(), out.data_ptr()):
        raise MemoryError("norm + rope kernel could not allocate its scratch row")
    return out[:, :heads], out[:, heads:]


def _plain_norm(norm) -> bool:
    """A `norm.RMSNorm` (not a subclass with other math) whose weight the C kernel reads as is."""
    return type(norm) is RMSNorm and norm.weight.dtype == torch.float32 and norm.weight.is_contiguous()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
