"""GGUF dense layers kept in their llama.cpp quantization (layers/ggml_linear.py) give the logits
of the same file with those layers dequantized at load (dense_format="float"), up to the one
rounding the packed GEMV adds: activations to int8 per 32, as llama.cpp does.

Checked exactly in two steps over whole models made by llama.cpp's converter (q8_0) or re-written
as a Q4_K_M-like mix: (1) the packed layers' weights, run as float matmuls, reproduce the
dequantized model (rows, parts, permutations and embeddings all in place); (2) the packed model
equals a float64 emulation of its arithmetic (int8-rounded activations x the dequantized weights)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers import exact_experts

from freetoken import LLM
from freetoken.layers import ggml_linear
from freetoken.layers.ggml_linear import GgmlEmbedding, GgmlLinear
from freetoken.layers.kernel_rows import GEMV_TOKENS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from model_checks import ids_for  # noqa: E402
from gguf_rewrite import q4_k_m, rewrite  # noqa: E402
from test_gguf_models import CONVERT_ARGS, K_QUANT_SHAPES, TINY  # noqa: E402


def q8_act(v: torch.Tensor) -> torch.Tensor:
    b = v.float().unflatten(-1, (-1, 32))
    d = b.abs().amax(-1, keepdim=True) / 127.0
    return (torch.round(b * torch.where(d > 0, 1.0 / d, torch.zeros_like(d))) * d).flatten(-2)


def _float_path(self, x, act=lambda v: v):
    """A packed layer as float64 math on its dequantized weights (act: the input rounding)."""
    x2 = act(x.reshape(-1, self.in_features).float()).double()
    y = F.linear(x2, self.dequantized().double(), None if self.bias is None else self.bias.double())
    return y.float().reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def packed_layers(llm) -> tuple[int, int]:
    m = llm.engine.model
    seen = [v for layer in m.layers for v in _walk(layer)] + [m.lm_head]
    return sum(isinstance(v, GgmlLinear) for v in seen), isinstance(m.embed_rows, GgmlEmbedding)


def _walk(obj, depth=0):
    if depth > 3 or not hasattr(obj, "__dict__"):
        return
    for v in vars(obj).values():
        yield v
        if not isinstance(v, (torch.Tensor, GgmlLinear)):
            yield from _walk(v, depth + 1)


def check_packed(g: Path, ids: list[int], monkeypatch):
    """Experts on the exact torch path (no int8 rounding there), so only the dense layers differ."""
    with exact_experts():
        _check_packed(g, ids, monkeypatch)


def _check_packed(g: Path, ids: list[int], monkeypatch):
    dequantized = LLM(str(g), dtype="float32", moe_backend="resident", dense_format="float").score(ids)
    # q8: the per-32 rounding the emulation applies ("auto" may take per-256 k-quant rows where its
    # calibration measures them faster: its own choice, test_ggml_numerics_q8k_rounds_the_k_quant_rows_per_256)
    packed_llm = LLM(str(g), dtype="float32", moe_backend="resident", ggml_numerics="q8")
    n_packed, embed_packed = packed_layers(packed_llm)
    assert n_packed >= 3 and embed_packed
    scale = max(1.0, dequantized.abs().max().item())
    calls = []                              # every packed call: its output vs the emulation on that input
    with monkeypatch.context() as mp:
        kernel = ggml_linear.GgmlLinear.__call__

        def checked(self, x):
            y = kernel(self, x)
            calls.append(((y - _float_path(self, x, q8_act)).abs().max().item(), y.abs().max().item()))
            return y
        mp.setattr(ggml_linear.GgmlLinear, "__call__", checked)
        packed = packed_llm.score(ids)
        mp.setattr(ggml_linear.GgmlLinear, "__call__", _float_path)
        as_float = LLM(str(g), dtype="float32", moe_backend="resident").score(ids)
        mp.setattr(ggml_linear.GgmlLinear, "__call__", lambda self, x: _float_path(self, x, q8_act))
        emulated = LLM(str(g), dtype="float32", moe_backend="resident").score(ids)
    assert (as_float - dequantized).abs().max().item() <= 1e-4 * scale
    # (2), layer by layer on the packed model's own inputs: the same int8 roundings, only float
    # summation apart. Whole models are not compared exactly: a 1e-7 summation difference
    # upstream can flip one int8 rounding at a near-tie, and attention carries that flip to every
    # later position (deepseek_v3 on a Zen 4: one flip at position 15 of 23, positions 15-22 off by
    # 3e-3..1e-2), so how many positions agree depends on where a flip happens to fall
    assert len(calls) >= n_packed
    assert all(d <= 1e-5 * max(1.0, m) for d, m in calls), max(calls)
    assert (packed - emulated).abs().max().item() <= 2e-2 * scale     # none far off
    # what the activation rounding costs on a tiny random model (logged for the record)
    print(f"{g.name}: packed vs dequantized dense {(packed - dequantized).abs().max().item():.3g} (scale {scale:.3g})")


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral", "olmoe", "gpt_oss", "qwen3_5_moe", "deepseek_v3"])
def test_q4_k_m_dense_layers_packed(tiny_dir, to_gguf, tmp_path, monkeypatch, arch):
    d = tiny_dir(arch, hidden=256, experts=4, **K_QUANT_SHAPES[arch], **TINY.get(arch, {}))
    g = rewrite(to_gguf(d, "f32", *CONVERT_ARGS.get(arch, ())), tmp_path / "q4km.gguf", q4_k_m)
    check_packed(g, ids_for(23, seed=6), monkeypatch)


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen2_moe", "glm4_moe"])
def test_q8_0_dense_layers_packed(tiny_dir, to_gguf, monkeypatch, arch):
    d = tiny_dir(arch, **TINY.get(arch, {}))
    check_packed(to_gguf(d, "q8_0", *CONVERT_ARGS.get(arch, ())), ids_for(29, seed=4), monkeypatch)


def test_prefill_tiles_equal_the_gemv_rows(tiny_dir, to_gguf, tmp_path):
    """A prompt longer than the GEMV limit runs the dequantize + GEMM path: its logits equal the
    dequantized model's to float rounding (no activation rounding there)."""
    d = tiny_dir("qwen3_moe", hidden=256, experts=4, **K_QUANT_SHAPES["qwen3_moe"])
    g = rewrite(to_gguf(d, "f32"), tmp_path / "q4km.gguf", q4_k_m)
    ids = ids_for(70, seed=2)
    assert len(ids) > GEMV_TOKENS
    a = LLM(str(g), dtype="float32", moe_backend="resident").score(ids)
    b = LLM(str(g), dtype="float32", moe_backend="resident", dense_format="float").score(ids)
    assert (a - b).abs().max().item() <= 1e-4 * max(1.0, b.abs().max().item())


def test_ggml_numerics_q8k_rounds_the_k_quant_rows_per_256(tiny_dir, to_gguf, tmp_path):
    """ggml_numerics="q8k" (the per-256 choice forced; "auto" calibrates it): a Q4_K_M model's
    GEMV logits stay close to the dequantized model's and differ from q8's per-32 ones."""
    from freetoken.kernels import cpu_kernels
    d = tiny_dir("qwen3_moe", hidden=256, experts=4, **K_QUANT_SHAPES["qwen3_moe"])
    g = rewrite(to_gguf(d, "f32"), tmp_path / "q4km.gguf", q4_k_m)
    ids = ids_for(20, seed=5)
    ref = LLM(str(g), dtype="float32", dense_format="float").score(ids)
    forced = LLM(str(g), dtype="float32", ggml_numerics="q8k")
    assert cpu_kernels().ft_set_ggml_k256(-1) == 0      # the choice is the engine's, not the process's
    with forced.engine.model.kernel_switches.installed():
        assert cpu_kernels().ft_set_ggml_k256(-1) == 1
    q8k = forced.score(ids)
    q8 = LLM(str(g), dtype="float32", ggml_numerics="q8").score(ids)
    scale = max(1.0, ref.abs().max().item())
    assert (q8k - ref).abs().max().item() <= 5e-2 * scale and not torch.equal(q8k, q8)


def test_ggml_numerics_float32_keeps_decode_exact(tiny_dir, to_gguf):
    """ggml_numerics="float32": a prompt within the GEMV limit runs exact activations too (logits
    of the dequantized model to float rounding), where the default q8 rounds them per 32."""
    g = to_gguf(tiny_dir("llama"), "q8_0")
    ids = ids_for(20, seed=3)
    ref = LLM(str(g), dtype="float32", dense_format="float").score(ids)
    tol = 1e-4 * max(1.0, ref.abs().max().item())
    exact = LLM(str(g), dtype="float32", ggml_numerics="float32").score(ids)
    assert (exact - ref).abs().max().item() <= tol
    q8 = LLM(str(g), dtype="float32", ggml_numerics="q8").score(ids)
    assert (q8 - ref).abs().max().item() > tol
