"""A verify's rows through the attention half in one C call (`ft_attn_half_rows`,
layers/attention/verify_half.py): the bits of the separate calls it replaces (every logits row and
token of speculative greedy decoding with drafts right, half right and wrong, the call on and off),
on the families whose layers take it and on one whose layers must not; and float64 torch math
(norms, qkv, q/k norms, rope at each row's position, each row's causal attention over the cache,
o, residual, post norm) within fp32 tolerance."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.kernels import variants_here
from freetoken.layers.attention import decode_half as half_mod
from freetoken.layers.attention.verify_half import VerifyHalf
from freetoken.tiny import make_tiny

sys.path.insert(0, str(Path(__file__).parent.parent / "engine"))
from test_speculative import ForcedDrafter, force, generate  # noqa: E402

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def _logits(llm: LLM) -> list[torch.Tensor]:
    rows, model = [], llm.engine.model
    orig = model.compute_logits
    model.compute_logits = lambda h: rows.append(orig(h).clone()) or rows[-1]
    return rows


def _spy(ran: list):
    call = VerifyHalf.__call__
    VerifyHalf.__call__ = lambda self, *a: (lambda r: ran.append(r is not None) or r)(call(self, *a))
    return call


@pytest.mark.parametrize("isa", variants_here())
@pytest.mark.parametrize("arch,dtype,taken", [("qwen3", "bfloat16", True), ("qwen3_moe", "float32", True),
                                              ("llama", "bfloat16", True), ("qwen2_moe", "bfloat16", True),
                                              ("olmoe", "bfloat16", False)])
def test_rows_call_is_the_separate_calls(tmp_path, arch, dtype, taken, isa):
    """Drafts right / half / wrong (2..9 rows a verify): the same logits rows, bit for bit, and
    the same tokens with the call on and off, on each kernel build (the call runs on the native
    build's pool only, as `ft_attn_half` does; the others must keep their separate calls' bits)."""
    path = make_tiny(arch, tmp_path / arch, layers=2, hidden=64, experts=8, top_k=2, vocab=400)
    plain = LLM(str(path), dtype=dtype, speculative="off", kernel_isa=isa, num_threads=2)
    spec = LLM(str(path), dtype=dtype, speculative="ngram", spec_max_draft=8, kernel_isa=isa, num_threads=2)
    prompts = [[5 + i for i in range(12)], [7, 3, 9, 4, 11, 2, 8]]
    ran = []
    call = _spy(ran)
    try:
        ref = generate(plain, prompts, GREEDY)
        for mode in ("right", "half", "wrong"):
            got = []
            for fused in (True, False):
                half_mod.FUSED[0] = fused
                try:
                    force(spec, ForcedDrafter(prompts, ref, mode))
                    rows = _logits(spec)
                    got.append((generate(spec, prompts, GREEDY), rows))
                finally:
                    half_mod.FUSED[0] = True
                    spec.engine.model.compute_logits = type(spec.engine.model).compute_logits.__get__(spec.engine.model)
            (toks, a), (toks_sep, b) = got
            assert toks == toks_sep == ref, mode
            assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b)), mode
    finally:
        VerifyHalf.__call__ = call
        plain.close()
        spec.close()
    assert any(ran) == (taken and isa == "native"), (arch, isa)


def _rms(x, w, eps):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def test_rows_call_matches_float64_torch(tmp_path):
    """h and post_norm(h) of each verify row t (position p + t) against float64 torch: the fused
    qkv weight, per-head q/k norms, NeoX rope, softmax attention over the keys up to and including
    its own (the cache as the call left it), o, residual and post norm; and each row's stored K."""
    path = make_tiny("qwen3", tmp_path / "m", layers=1, hidden=64, vocab=400)
    llm = LLM(str(path), dtype="float32", num_threads=2, prefix_cache=False, speculative="ngram", spec_max_draft=6)
    try:
        model = llm.engine.model
        layer = model.layers[0]
        seen, orig = [], VerifyHalf.__call__

        def spy(self, x, cos, sin, cache, meta):
            r = orig(self, x, cos, sin, cache, meta)
            if r is not None:
                _, keys, lens, _ = meta.verify
                seen.append((x.clone(), lens.clone(), keys.clone(), meta.slot_mapping.clone(), cache.k.clone(),
                             cache.v.clone(), r[0].clone(), r[1].clone()))
            return r
        prompt = [3, 4, 5, 6, 7, 8, 9, 10]
        ref = generate(llm, [prompt], GREEDY)
        force(llm, ForcedDrafter([prompt], ref, "half"))
        VerifyHalf.__call__ = spy
        try:
            assert generate(llm, [prompt], GREEDY) == ref
        finally:
            VerifyHalf.__call__ = orig
        assert seen, "the rows call never ran"
        a = layer.attn
        hq, hk, d = a.heads, a.kv_heads, a.head_dim
        w_qkv, w_o = a.qkv.dequantized().double(), a.o.dequantized().double()
        theta = model.hf.get("rope_theta", 10000.0)
        inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        for x, lens, keys, slots, kc, vc, h, normed in seen:
            assert x.shape[0] > 1
            xn = _rms(x.double(), layer.input_norm.weight.double(), layer.input_norm.eps)
            qkv = xn @ w_qkv.T
            for t in range(x.shape[0]):
                n = int(lens[t])
                ang = torch.cat([(n - 1) * inv, (n - 1) * inv])
                rot = lambda v: v * ang.cos() + torch.cat([-v[..., d // 2:], v[..., :d // 2]], -1) * ang.sin()  # noqa: E731
                q = rot(_rms(qkv[t, :hq * d].view(hq, d), a.q_norm.weight.double(), a.q_norm.eps))
                k = rot(_rms(qkv[t, hq * d:(hq + hk) * d].view(hk, d), a.k_norm.weight.double(), a.k_norm.eps))
                assert torch.allclose(kc[slots[t]].double(), k, atol=1e-5, rtol=1e-4)
                assert torch.allclose(vc[slots[t]].double(), qkv[t, (hq + hk) * d:].view(hk, d), atol=1e-5)
                ks, vs = kc[keys[t, :n]].double(), vc[keys[t, :n]].double()
                g = hq // hk
                att = torch.stack([torch.softmax(ks[:, i // g] @ q[i] / math.sqrt(d), 0) @ vs[:, i // g]
                                   for i in range(hq)])
                h64 = x[t].double() + att.reshape(-1) @ w_o.T
                assert torch.allclose(h[t].double(), h64, atol=1e-4, rtol=1e-4)
                n64 = _rms(h64, layer.post_norm.weight.double(), layer.post_norm.eps)
                assert torch.allclose(normed[t].double(), n64, atol=1e-4, rtol=1e-4)
    finally:
        llm.close()
