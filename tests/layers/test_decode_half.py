"""A one-row decode step's attention half in one C call (`ft_attn_half`, layers/attention/decode_half.py):
the bits of the separate calls it replaces (input norm, qkv GEMV, q/k norms + rope, KV write,
decode attention, o GEMV, residual add + post-attention norm), greedy tokens and every logits row,
on the model families whose layers take it and on those that must not (their own attention
math); and float64 torch attention math within fp32 tolerance."""
from __future__ import annotations

import math

import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.kernels import variants_here
from freetoken.layers.attention import decode_half as half_mod
from freetoken.layers.attention.decode_half import AttnHalf
from freetoken.layers.attention.decode_stack import DecodeStack
from freetoken.tiny import make_tiny

# (arch, whether its layers take the one call): qwen3_moe per-head q/k norms, llama none,
# qwen2_moe qkv biases, mixtral GQA, gpt_oss sinks + sliding-window rings + q/k/v/o biases + YaRN
# (its windowed layers' keys in the sequence's ring); olmoe normalizes the whole projection (not taken)
ARCHS = (("qwen3_moe", True), ("llama", True), ("qwen2_moe", True), ("mixtral", True), ("gpt_oss", True),
         ("olmoe", False))


def _decode(llm: LLM, prompts: list[list[int]], tokens: int):
    """(token ids of each prompt, every logits row the steps computed), greedy."""
    model = llm.engine.model
    rows, orig = [], model.compute_logits
    model.compute_logits = lambda h: rows.append(orig(h).clone()) or rows[-1]
    try:
        out = llm.generate(prompts, SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True))
    finally:
        model.compute_logits = orig
    return [o.token_ids for o in out], rows


# bf16 weights and KV cache (fp32 activations), fp32 throughout, int8 dense weights (Q8_0-sized)
OPTIONS = ({"dtype": "bfloat16"}, {"dtype": "float32"}, {"dtype": "bfloat16", "dense_format": "int8"})


@pytest.mark.parametrize("opts", OPTIONS, ids=["bf16", "fp32", "int8"])
@pytest.mark.parametrize("arch,taken", ARCHS)
def test_one_call_half_is_the_separate_calls(tmp_path, arch, taken, opts):
    _same_bits(tmp_path, arch, taken, {"moe_backend": "cpu", **opts})


def test_one_call_half_on_the_torch_experts(tmp_path):
    """The resident backend (torch experts, no fused experts call): the MoE block's residual
    add stays in torch after the one-call attention half."""
    _same_bits(tmp_path, "qwen3_moe", True, {"moe_backend": "resident", "dtype": "bfloat16"})


@pytest.mark.parametrize("isa", variants_here())
def test_one_call_half_gpt_oss_mxfp4_on_every_build(tmp_path, isa):
    """gpt-oss with MXFP4 experts (its shipped format) on each kernel build the CPU runs: the
    one call (the native build's pool only; the others keep the separate calls) is their bits."""
    _same_bits(tmp_path, "gpt_oss_mxfp4", isa == "native", {"moe_backend": "cpu", "dtype": "bfloat16",
                                                            "kernel_isa": isa})


def _same_bits(tmp_path, arch: str, taken: bool, opts: dict):
    path = make_tiny(arch, tmp_path / arch, layers=2, hidden=64, experts=8, top_k=2, vocab=512)
    llm = LLM(str(path), num_threads=2, prefix_cache=False, speculative="off", **opts)
    try:
        # the one-row steps take the call: the half itself, or the stack of the halves (whose first
        # step runs them one by one, unless a few rows' step, a prompt of <= 16, built them first)
        ran = []
        call, stack = AttnHalf.__call__, DecodeStack.__call__
        AttnHalf.__call__ = lambda self, *a: (lambda r: ran.append(r is not None) or r)(call(self, *a))
        DecodeStack.__call__ = lambda self, *a: (lambda r: ran.append(r is not None) or r)(stack(self, *a))
        try:
            for prompts in ([[5, 6, 7, 8, 9]], [[5, 6, 7, 8, 9], [11, 12]]):   # one row a step, then two
                fused = _decode(llm, prompts, 12)
                half_mod.FUSED[0] = False
                try:
                    ref = _decode(llm, prompts, 12)
                finally:
                    half_mod.FUSED[0] = True
                assert fused[0] == ref[0]
                assert len(fused[1]) == len(ref[1]) and all(torch.equal(a, b) for a, b in zip(fused[1], ref[1]))
        finally:
            AttnHalf.__call__, DecodeStack.__call__ = call, stack
        assert any(ran) == taken, arch
    finally:
        llm.close()


def _rms(x, w, eps):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def test_one_call_half_matches_float64_torch(tmp_path, stack_off):
    """h and post_norm(h) of a decode row at position p against float64 torch: norms, the fused
    qkv weight, per-head q/k norms, NeoX rope, softmax attention over the p earlier keys written
    by the prefill plus the row's own, o (every step's half called from Python: the stack off)."""
    path = make_tiny("qwen3_moe", tmp_path / "m", layers=1, hidden=64, experts=8, top_k=2)
    llm = LLM(str(path), dtype="float32", moe_backend="cpu", num_threads=2, prefix_cache=False, speculative="off")
    try:
        model = llm.engine.model
        layer = model.layers[0]
        seen = []
        orig = AttnHalf.__call__

        def spy(self, x, cos, sin, cache, meta, ring=None):
            r = orig(self, x, cos, sin, cache, meta, ring)
            if r is not None:
                seen.append((x.clone(), int(meta.context_lens[0]), meta.key_slots[0].clone(), cache.k.clone(),
                             cache.v.clone(), r[0].clone(), r[1].clone()))
            return r
        AttnHalf.__call__ = spy
        try:
            llm.generate([[3, 4, 5, 6, 7, 8]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        finally:
            AttnHalf.__call__ = orig
        assert seen, "the one-call half never ran"
        a = layer.attn
        hq, hk, d = a.heads, a.kv_heads, a.head_dim
        w_qkv = a.qkv.dequantized().double()
        w_o = a.o.dequantized().double()
        for x, n, slots, kc, vc, h, normed in seen:
            x64 = x.double()
            xn = _rms(x64, layer.input_norm.weight.double(), layer.input_norm.eps)
            qkv = xn @ w_qkv.T
            q = qkv[0, :hq * d].view(hq, d)
            q = _rms(q, a.q_norm.weight.double(), a.q_norm.eps)
            pos = n - 1
            inv = 1.0 / (model.hf.get("rope_theta", 10000.0) ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
            ang = torch.cat([pos * inv, pos * inv])
            rot = lambda t: t * ang.cos() + torch.cat([-t[..., d // 2:], t[..., :d // 2]], -1) * ang.sin()  # noqa: E731
            q = rot(q)
            keys = kc[slots[:n]].double()           # the cache as the call left it (the row's own K/V included)
            vals = vc[slots[:n]].double()
            g = hq // hk
            att = torch.stack([torch.softmax(keys[:, i // g] @ q[i] / math.sqrt(d), 0) @ vals[:, i // g]
                               for i in range(hq)])
            h64 = x64 + att.reshape(1, -1) @ w_o.T
            assert torch.allclose(h.double(), h64, atol=1e-4, rtol=1e-4)
            n64 = _rms(h64, layer.post_norm.weight.double(), layer.post_norm.eps)
            assert torch.allclose(normed.double(), n64, atol=1e-4, rtol=1e-4)
            # the row's own K as stored: its k norm and rope of the GEMV's k columns
            k = _rms(qkv[0, hq * d:(hq + hk) * d].view(hk, d), a.k_norm.weight.double(), a.k_norm.eps)
            assert torch.allclose(kc[slots[n - 1]].double(), rot(k), atol=1e-5, rtol=1e-4)
    finally:
        llm.close()


def test_gpt_oss_half_matches_float64_torch(tmp_path):
    """gpt-oss's h and post_norm(h) of decode rows past the window, sliding layer (its ring) and
    full layer (paged), against float64 torch: q/k/v and o biases, the call's rope tables, GQA
    softmax attention with each head's sink logit (its mass dropped) over the visible keys only."""
    path = make_tiny("gpt_oss", tmp_path / "m", layers=2, hidden=64, experts=8, top_k=2)
    llm = LLM(str(path), dtype="float32", moe_backend="cpu", num_threads=2, prefix_cache=False, speculative="off")
    try:
        model = llm.engine.model
        seen = []
        orig = AttnHalf.__call__

        def spy(self, x, cos, sin, cache, meta, ring=None):
            r = orig(self, x, cos, sin, cache, meta, ring)
            if r is not None:
                if ring is not None:
                    sw, i = ring
                    p, w = sw.position, sw.window
                    rows = [q % w for q in range(max(0, p + 1 - w), p + 1)]
                    kv = sw.k[i, rows].clone(), sw.v[i, rows].clone()
                else:
                    n = int(meta.context_lens[0])
                    kv = cache.k[meta.key_slots[0, :n]].clone(), cache.v[meta.key_slots[0, :n]].clone()
                seen.append((self, x.clone(), cos.clone(), sin.clone(), *kv, r[0].clone(), r[1].clone(), ring))
            return r
        AttnHalf.__call__ = spy
        try:
            llm.generate([list(range(3, 13))], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        finally:
            AttnHalf.__call__ = orig
        assert {s[-1] is None for s in seen} == {True, False}, "both kinds of layer take the call"
        for half, x, cos, sin, keys, vals, h, normed, ring in seen:
            a, (n_in, n_post) = half.attn, half.norms
            hq, hk, d = a.heads, a.kv_heads, a.head_dim
            xn = _rms(x.double(), n_in.weight.double(), n_in.eps)
            qkv = xn @ a.qkv.dequantized().double().T + a.qkv.bias.double()
            c, s_ = cos.double().view(-1), sin.double().view(-1)
            rot = lambda t: t * c + torch.cat([-t[..., d // 2:], t[..., :d // 2]], -1) * s_  # noqa: E731
            q = rot(qkv[0, :hq * d].view(hq, d))
            assert torch.allclose(keys[-1].double(), rot(qkv[0, hq * d:(hq + hk) * d].view(hk, d)), atol=1e-5)
            assert ring is None or keys.shape[0] <= ring[0].window
            g, out = hq // hk, []
            for i in range(hq):
                logits = torch.cat([keys[:, i // g].double() @ q[i] * a.scale, a.sinks[i:i + 1].double()])
                out.append(torch.softmax(logits, 0)[:-1] @ vals[:, i // g].double())
            h64 = x.double() + torch.stack(out).reshape(1, -1) @ a.o.dequantized().double().T + a.o.bias.double()
            assert torch.allclose(h.double(), h64, atol=1e-4, rtol=1e-4)
            assert torch.allclose(normed.double(), _rms(h64, n_post.weight.double(), n_post.eps), atol=1e-4, rtol=1e-4)
    finally:
        llm.close()
