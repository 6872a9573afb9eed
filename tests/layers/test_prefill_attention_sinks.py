"""gpt-oss's prefill attention (learned sinks, sliding windows) in the library's prefill kernel
(kernels/c/prefill_attention.c, each mode this CPU runs: AMX tiles, vdpbf16ps) against float64
attention with the sink logit and the causal/window mask written out, 1..4096 tokens, chunks
continuing earlier keys; and through the two routes gpt-oss takes (the paged cache of its full
layers, the ring of its window layers) with every mode, torch's (the masked fp32 path) included.

Tolerance as tests/layers/test_prefill_attention_tiles.py's: the numerators are rounded to bf16
before P x V (2^-9 relative); a sink only adds mass to the denominator, so the same 2 x 2^-9 x
max|v| bound holds."""
import pytest
import torch

from freetoken.kernels import load
from freetoken.kernels.pool import CpuPool
from freetoken.layers.attention import prefill
from freetoken.layers.attention.sinks import paged_attention_sinks, window_attention_sinks
from tests.helpers import paged_mixed_step

MODES = {"torch": 0, "amx": 1, "vdpbf16ps": 2}     # ft_set_prefill_att's codes


def _pool(name):
    lib = load("native")
    mode = MODES[name]
    if lib is None or lib.ft_set_prefill_att(mode) != mode:
        pytest.skip(f"{name} does not run here (AMX: amx_bf16 and the OS's grant of the tile state; "
                    "vdpbf16ps: avx512_bf16)")
    p = CpuPool(lib, 2)
    p.mode = mode
    return p


@pytest.fixture(scope="module", params=["amx", "vdpbf16ps"])
def pool(request):
    p = _pool(request.param)
    yield p
    p.lib.ft_set_prefill_att(0)
    p.close()


@pytest.fixture(scope="module", params=list(MODES))
def any_pool(request):
    p = _pool(request.param)
    yield p
    p.lib.ft_set_prefill_att(0)
    p.close()


def reference(q, k, v, scale, sinks=None, window=None, block=512):
    """q [1, Hq, Q, D] at the last Q of K positions -> float64 [1, Hq, Q, D]: softmax over the
    visible keys' scores and the head's sink logit (its mass dropped), in query blocks."""
    hq, nq, nk = q.shape[1], q.shape[2], k.shape[2]
    g = hq // k.shape[1]
    kd, vd = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    out = torch.empty(q.shape, dtype=torch.float64)
    kpos = torch.arange(nk)[None, :]
    for s in range(0, nq, block):
        qpos = torch.arange(nk - nq + s, nk - nq + min(s + block, nq))[:, None]
        mask = kpos <= qpos
        if window:
            mask &= kpos > qpos - window
        sc = (q[:, :, s:s + block].double() @ kd.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
        if sinks is not None:
            sc = torch.cat([sc, sinks.double().view(1, hq, 1, 1).expand(*sc.shape[:-1], 1)], -1)
        p = torch.softmax(sc, -1)
        out[:, :, s:s + block] = (p[..., :nk] if sinks is not None else p) @ vd
    return out


def bound(v):
    return 2 * 2.0 ** -9 * v.abs().max().item()


def inputs(seed, hq, hkv, d, nq, nk, sink_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, h, n, d, generator=g).bfloat16() for h, n in ((hq, nq), (hkv, nk), (hkv, nk)))
    return q, k, v, sink_scale * torch.randn(hq, generator=g)


@pytest.mark.parametrize("hq,hkv,d,nq,nk,window", [
    (1, 1, 64, 1, 1, None), (1, 1, 64, 1, 1, 1), (8, 1, 64, 37, 37, 16), (8, 2, 64, 37, 37, 1),
    (64, 8, 64, 300, 300, 128),            # gpt-oss's heads and window
    (4, 2, 128, 97, 645, 128),             # a chunk after 548 earlier keys, windowed
    (8, 2, 64, 129, 1000, None),           # a chunk after earlier keys, sinks only
    (6, 3, 64, 45, 1000, 2000),            # a window wider than the keys: none
    (4, 1, 64, 2, 700, 33), (16, 8, 64, 1, 300, 128)])
def test_sinks_and_windows_match_float64(pool, hq, hkv, d, nq, nk, window):
    q, k, v, sinks = inputs(7 * nk + nq, hq, hkv, d, nq, nk)
    out = prefill.tiles_chunk(pool, q, k, v, d ** -0.5, sinks=sinks, window=window)
    assert out is not None
    assert (out.double() - reference(q, k, v, d ** -0.5, sinks, window)).abs().max() <= bound(v)


@pytest.mark.parametrize("window", [None, 128])
def test_4096_tokens(pool, window):
    q, k, v, sinks = inputs(3, 4, 1, 64, 4096, 4096)
    out = prefill.tiles_chunk(pool, q, k, v, 0.125, sinks=sinks, window=window)
    assert (out.double() - reference(q, k, v, 0.125, sinks, window)).abs().max() <= bound(v)


def test_window_without_sinks_and_sinks_that_dominate(pool):
    """A window alone (rows start at -inf) and sinks far above every score (the numerators tiny)
    or far below (no mass), scores spread over hundreds."""
    q, k, v, _ = inputs(9, 8, 2, 64, 200, 260)
    q = (4 * q.float()).bfloat16()
    out = prefill.tiles_chunk(pool, q, k, v, 0.5, window=50)
    assert (out.double() - reference(q, k, v, 0.5, None, 50)).abs().max() <= bound(v)
    sinks = torch.tensor([300.0, -300.0] * 4)
    out = prefill.tiles_chunk(pool, q, k, v, 0.5, sinks=sinks, window=50)
    assert (out.double() - reference(q, k, v, 0.5, sinks, 50)).abs().max() <= bound(v)


def test_paged_full_layers_every_mode(any_pool):
    """paged_attention_sinks on a mixed step (a fresh prompt, a chunk continuing a cached prefix,
    a decode token) with the mode switched on; torch's mode takes the masked fp32 path."""
    g = torch.Generator().manual_seed(11)
    hq, hkv, d = 8, 2, 64
    cache, meta, n = paged_mixed_step(g, hkv, d, torch.bfloat16, [(0, 50), (700, 130), (999, 1)])
    meta.kernel_pool = any_pool
    q = torch.randn(n, hq, d, generator=g)
    k, v = torch.randn(n, hkv, d, generator=g), torch.randn(n, hkv, d, generator=g)
    sinks = torch.randn(hq, generator=g)
    out = paged_attention_sinks(q, k, v, cache, meta, d ** -0.5, sinks, prefill_dtype=torch.bfloat16)
    for i, (qi, pos) in enumerate(zip(meta.query_index, meta.query_positions)):
        nq, nk = int((pos >= 0).sum()), int(meta.context_lens[i])
        keys = cache.k[meta.key_slots[i, :nk]].transpose(0, 1)[None]
        vals = cache.v[meta.key_slots[i, :nk]].transpose(0, 1)[None]
        qs = q[qi[:nq]].transpose(0, 1)[None]
        ref = reference(qs.bfloat16() if any_pool.mode else qs, keys, vals, d ** -0.5, sinks)
        assert (out[qi[:nq]].transpose(0, 1)[None].double() - ref).abs().max() <= bound(vals)


@pytest.mark.parametrize("past,new", [(0, 300), (128, 200), (40, 1), (0, 1)])
def test_window_layers_every_mode(any_pool, past, new):
    """window_attention_sinks as a window layer's prefill chunk runs it: the ring's last `past`
    keys (window 128) before the chunk's own."""
    g = torch.Generator().manual_seed(past + new)
    hq, hkv, d, window = 16, 2, 64, 128
    q = torch.randn(new, hq, d, generator=g)
    k, v = torch.randn(new, hkv, d, generator=g), torch.randn(new, hkv, d, generator=g)
    pk, pv = torch.randn(past, hkv, d, generator=g), torch.randn(past, hkv, d, generator=g)
    sinks = torch.randn(hq, generator=g)
    pos = torch.arange(1000, 1000 + new)
    out = window_attention_sinks(q, k, v, pos, pk, pv, pos[:1] - past + torch.arange(past), d ** -0.5, sinks, window,
                                 any_pool, torch.bfloat16)
    rnd = (lambda t: t.bfloat16()) if any_pool.mode else (lambda t: t)
    keys, vals = (rnd(torch.cat([a, b])).transpose(0, 1)[None] for a, b in ((pk, k), (pv, v)))
    ref = reference(rnd(q).transpose(0, 1)[None], keys, vals, d ** -0.5, sinks, window)
    assert (out.transpose(0, 1)[None].double() - ref).abs().max() <= bound(vals)
