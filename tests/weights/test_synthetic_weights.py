"""The random-weight GGUF's weights (weights/gguf/synthetic.py), decoded by `gguf.quants`
(independent of our kernels): zero-mean at the rms the gains ask for, and token embeddings
that differ by token. With random bytes as block scales every Q4_K value had a positive mean,
two tokens' embeddings were parallel (cosine 0.99) and the 48-layer file routed every token
to the same 8 experts of a layer (docs/benchmarks.md, "Routing spread")."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from freetoken.weights.gguf import synthetic as sg


def dequant(ty: int, shape: tuple[int, int], gain: float = 1.0, seed: int = 0) -> np.ndarray:
    blob = sg.random_tensor(np.random.default_rng(seed), shape, ty, gain)
    return gguf.quants.dequantize(blob, gguf.GGMLQuantizationType(ty))


@pytest.mark.parametrize("ty", [sg.Q4_K, sg.Q6_K])
def test_weights_are_zero_mean_at_the_fan_in_rms(ty):
    w = dequant(ty, (64, 2048))
    rms = float(np.sqrt((w.astype(np.float64) ** 2).mean()))
    assert rms == pytest.approx(1 / np.sqrt(2048), rel=0.1)
    assert abs(float(w.mean())) < 0.02 * rms
    # the row sums: what a matrix adds along its ones direction is noise, not a common mean
    assert np.abs(w.sum(axis=1)).mean() < 3 * rms * np.sqrt(2048)


def test_gain_scales_a_q4_k_tensor():
    base, scaled = dequant(sg.Q4_K, (8, 2048)), dequant(sg.Q4_K, (8, 2048), gain=30.0)
    assert float(np.abs(scaled).mean() / np.abs(base).mean()) == pytest.approx(30.0, rel=0.01)


def test_two_tokens_embeddings_are_not_parallel():
    e = dequant(sg.Q4_K, (32, 2048), gain=sg.gain("token_embd.weight")).astype(np.float64)
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    cos = e @ e.T
    assert np.abs(cos[~np.eye(32, dtype=bool)]).max() < 0.15


def test_attention_output_gain_falls_with_depth():
    g = [sg.gain(f"blk.{i}.attn_output.weight") for i in range(48)]
    assert all(a > b > 0 for a, b in zip(g, g[1:]))
    assert sg.gain("blk.3.ffn_down_exps.weight") == 1.0
