"""`--ggml-numerics llama-exact`: a built dense Llama-family model switched to llama.cpp's CPU
arithmetic bit for bit (quant/ggml_exact.py): its RMS norms, rope, attention (f16 K/V/Q and
probabilities, tinyBLAS sums, ggml's softmax), SiLU and Q4_1 layers. A layer of another ggml
type keeps the C kernels under llama.cpp's q8 rounding ("llama"); the output layer and the
embedding are not emulated (the logits' last ulp decides nothing here). The arithmetic runs in
torch, so this mode is several times slower than "q8": a tool for agreeing with llama.cpp
(bench/quality.py, bench/llamacpp_dump.py), not for serving."""
from __future__ import annotations

import numpy as np
import torch

from ..errors import InvalidRequestError
from ..kernels import cpu_kernels
from ..layers.attention.paged import gather, scatter
from ..layers.ggml_linear import GgmlLinear
from ..layers.kernel_rows import GEMV_TOKENS
from ..layers.rope import rope_parameters
from ..quant import ggml_exact as ge


LLAMA_CLASSES = ("LlamaForCausalLM", "MistralForCausalLM")     # GGUF arch llama: permuted q/k, normal rope


class ExactNorm:
    def __init__(self, weight: torch.Tensor, eps: float):
        self.weight, self.eps = weight, eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return ge.rms_norm(x, self.weight, self.eps)


class ExactRotary:
    """ggml's rope cache for positions [0, max_len) (cos/sin [N, 1, dim / 2] per step)."""

    def __init__(self, base: float, dim: int, max_len: int):
        self.cos, self.sin = ge.rope_tables(max_len, dim, base)
        self.dim = dim

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos.index_select(0, positions).unsqueeze(1), self.sin.index_select(0, positions).unsqueeze(1)


class ExactLinear:
    """A GgmlLinear of Q4_1 parts summed as ggml_vec_dot_q4_1_q8_1 sums them."""

    def __init__(self, lin: GgmlLinear):
        self.rows = [ge.Q41Rows(p.rows, p.cols) for p in lin.parts]
        self.bias, self.in_features, self.out_features = lin.bias, lin.in_features, lin.out_features
        self.lib, self.threads = lin.pool.lib, lin.pool.num_threads

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x = x.reshape(-1, self.in_features)
        y = torch.cat([ge.q4_1_matmul(x, r, self.lib, self.threads) for r in self.rows], -1)
        y = y if self.bias is None else y + self.bias
        return y.reshape(*lead, self.out_features)


def exact_linear(lin):
    return ExactLinear(lin) if isinstance(lin, GgmlLinear) and ge.supported(lin.parts) else lin


def interleaved(x: torch.Tensor) -> torch.Tensor:
    """Head dims (i, i + D/2) side by side: the order of llama.cpp's Q and K rows (the GGUF
    converter permutes Llama's q/k weights for its normal rope; FreeToken un-permutes them)."""
    return x.unflatten(-1, (2, x.shape[-1] // 2)).transpose(-1, -2).flatten(-2)


class ExactAttention:
    """A decoder Attention run as llama.cpp's graph: q/k/v, ggml rope, f16 cache rows, ggml
    attention with kq_scale = 1 / sqrtf(head_dim); its other attributes are the wrapped one's."""

    def __init__(self, attn, lib):
        self.attn, self.lib = attn, lib
        self.kq_scale = float(np.float32(1) / np.sqrt(np.float32(attn.head_dim)))

    def __getattr__(self, name):
        return getattr(self.attn, name)

    def __call__(self, x, cos, sin, cache, meta):
        a, n = self.attn, x.shape[0]
        q, k, v = a.qkv(x).split(a.splits, dim=-1)
        q = ge.rope(q.reshape(n, a.heads, a.head_dim), cos, sin)
        k = ge.rope(k.reshape(n, a.kv_heads, a.head_dim), cos, sin)
        v = v.reshape(n, a.kv_heads, a.head_dim)
        queries, keys, values = gather(q, ge.f16(k), ge.f16(v), cache, meta)
        queries, keys = interleaved(queries), interleaved(keys)     # K Q sums in the GGUF rows' order
        visible = meta.mask(a.window)
        # a decode or verify step (a few rows after cached keys): each row as llama.cpp's one-token step
        steps = queries.shape[2] <= GEMV_TOKENS and bool((visible[:, 0, 0].sum(-1) > 1).all())
        out = ge.attention(queries, keys, values, visible, self.kq_scale, self.lib, steps)
        return a.o(scatter(out, meta).reshape(n, -1))


def check(model) -> None:
    """The model must be what this emulation covers: a dense Llama-style decoder, float32
    activations and KV, plain rope over the whole head, no q/k norms or clipping."""
    params = rope_parameters(model.hf.data)
    why = ("it is not a Llama-architecture decoder" if type(model).__name__ not in LLAMA_CLASSES else
           f"activations are {model.dtype}, not float32 (--dtype float32)" if model.dtype != torch.float32 else
           f"the KV cache is {model.kv_dtype}, not float32" if model.kv_dtype != torch.float32 else
           f"rope type {params['rope_type']!r}" if params["rope_type"] != "default" else
           "a partial rotary dim" if model.rotary.dim != model.head_dim else
           f"head dim {model.head_dim}, not a multiple of 64" if model.head_dim % 64 else
           "q/k norms or clipping" if any(L.attn.qk_norm or L.attn.clip is not None for L in model.layers) else
           "a sliding window" if any(L.attn.window for L in model.layers) else
           "the model is not on the CPU" if model.device.type != "cpu" else None)
    if why:
        raise InvalidRequestError(f"ggml_numerics 'llama-exact' emulates llama.cpp's CPU arithmetic for dense "
                                  f"Llama-style models in float32 only; this model does not fit: {why}")


def apply(model) -> None:
    """Switch a built model's layers to llama.cpp's arithmetic (see the module doc)."""
    check(model)
    model.rotary = ExactRotary(float(rope_parameters(model.hf.data)["rope_theta"]), model.head_dim, model.max_len)
    model.norm = ExactNorm(model.norm.weight, model.norm.eps)
    for layer in model.layers:
        layer.input_norm = ExactNorm(layer.input_norm.weight, layer.input_norm.eps)
        layer.post_norm = ExactNorm(layer.post_norm.weight, layer.post_norm.eps)
        a = layer.attn
        a.qkv, a.o = exact_linear(a.qkv), exact_linear(a.o)
        layer.attn = ExactAttention(a, cpu_kernels())
        mlp = layer.mlp
        mlp.gate_up, mlp.down = exact_linear(mlp.gate_up), exact_linear(mlp.down)
        if mlp.act is torch.nn.functional.silu:
            mlp.act = ge.silu
