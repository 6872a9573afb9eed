import pytest
import torch

from freetoken.kernels.pool import shared_pool
from freetoken.layers.deltanet import (
    GatedDeltaNet,
    causal_conv1d,
    chunk_gated_delta_rule,
    recurrent_gated_delta_rule,
)
from freetoken.layers.linear import LinearFactory

torch.manual_seed(0)


def _inputs(b=2, t=37, hk=2, hv=4, dk=8, dv=6):
    q = torch.randn(b, t, hk, dk)
    k = torch.randn(b, t, hk, dk)
    v = torch.randn(b, t, hv, dv)
    g = -torch.rand(b, t, hv) * 0.5
    beta = torch.rand(b, t, hv)
    return q, k, v, g, beta


@pytest.mark.parametrize("t", [1, 5, 64, 130])
def test_chunked_equals_recurrent(t):
    args = _inputs(t=t)
    o1, s1 = recurrent_gated_delta_rule(*args)
    o2, s2 = chunk_gated_delta_rule(*args, chunk_size=16)
    torch.testing.assert_close(o1, o2, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(s1, s2, atol=1e-5, rtol=1e-4)


def test_matches_transformers_rules():
    from transformers.models.qwen3_next import modeling_qwen3_next as hf

    q, k, v, g, beta = _inputs(t=100)
    s0 = torch.randn(2, 4, 8, 6)
    ref_o, ref_s = hf.torch_chunk_gated_delta_rule(
        q, k, v, g=g, beta=beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    o, s = chunk_gated_delta_rule(q, k, v, g, beta, s0)
    torch.testing.assert_close(o, ref_o, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(s, ref_s, atol=1e-5, rtol=1e-4)
    ref_o, ref_s = hf.torch_recurrent_gated_delta_rule(
        q[:, :3], k[:, :3], v[:, :3], g=g[:, :3], beta=beta[:, :3], initial_state=s0,
        output_final_state=True, use_qk_l2norm_in_kernel=True)
    o, s = recurrent_gated_delta_rule(q[:, :3], k[:, :3], v[:, :3], g[:, :3], beta[:, :3], s0)
    torch.testing.assert_close(o, ref_o, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(s, ref_s, atol=1e-5, rtol=1e-4)


def test_conv_state_resume():
    x = torch.randn(2, 12, 20)
    w = torch.randn(12, 4)
    full, _ = causal_conv1d(x, w)
    a, st = causal_conv1d(x[:, :, :2], w)
    b, st = causal_conv1d(x[:, :, 2:3], w, st)
    c, _ = causal_conv1d(x[:, :, 3:], w, st)
    torch.testing.assert_close(torch.cat([a, b, c], -1), full)


def _hf_layer(arch):
    if arch == "qwen3_next":
        from transformers import Qwen3NextConfig as C
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet as L
    else:
        from transformers import Qwen3_5MoeTextConfig as C
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeGatedDeltaNet as L
    cfg = C(hidden_size=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
            linear_value_head_dim=6, linear_conv_kernel_dim=4, num_hidden_layers=1, rms_norm_eps=1e-6)
    layer = L(cfg, 0).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        layer.A_log.copy_(torch.rand(4).log())
    sd = layer.state_dict()
    # the kernels' pool: the CPU GEMV for decode steps, dequantize + GEMM for chunks
    linear = LinearFactory(torch.float32, torch.float32, None, shared_pool())
    ours = GatedDeltaNet.load(lambda n: sd[n], cfg.to_dict(), linear)
    return layer, ours


@pytest.mark.parametrize("arch", ["qwen3_next", "qwen3_5"])
def test_layer_matches_transformers_and_resumes(arch):
    layer, ours = _hf_layer(arch)
    x = torch.randn(2, 70, 32)
    with torch.no_grad():
        ref = layer(x)
        out, _, _ = ours(x)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
        # prefill 0..40, decode 40..45 one by one, prefill the rest
        o1, cs, rs = ours(x[:, :40])
        outs = [o1]
        for i in range(40, 45):
            o, cs, rs = ours(x[:, i:i + 1], cs, rs)
            outs.append(o)
        o, cs, rs = ours(x[:, 45:], cs, rs)
        outs.append(o)
        torch.testing.assert_close(torch.cat(outs, 1), ref, atol=1e-5, rtol=1e-4)
