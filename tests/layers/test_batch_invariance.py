"""Batch invariance of the decode/verify path: a step of n rows (n <= GEMV_TOKENS = 1 + the most
drafted tokens) gives every row the bits n separate one-row steps give it, layer type by layer
type, in every kernel variant this CPU runs. This is what makes speculative greedy output
token-for-token plain decoding's: a verify is a step of k + 1 rows a sequence."""
from __future__ import annotations

import pytest
import torch

from freetoken import kernels
from freetoken.experts.execution.numerics import bf16_dot as bf16_dot_now, set_bf16_dot
from freetoken.kernels.pool import CpuPool, shared_pool
from freetoken.layers.attention.paged import AttentionMetadata, KVCache, paged_attention
from freetoken.layers.ggml_linear import KERNEL_TYPES, GgmlEmbedding, GgmlLinear, GgmlWeight
from freetoken.layers.kernel_rows import GEMV_TOKENS
from freetoken.layers.linear import Linear
from freetoken.layers.norm import RMSNorm
from freetoken.layers.rope import Rotary, norm_rope_qk
from freetoken.quant import ggml_quants as gq
from freetoken.quant.ggml_act import ACT_MODES
from freetoken.quant.ggml_iquants import TYPES as I_QUANTS

ISAS = kernels.variants_here()
ROWS = (2, 3, 9, 17, GEMV_TOKENS)


def one_by_one(f, x: torch.Tensor) -> torch.Tensor:
    return torch.cat([f(x[i:i + 1]) for i in range(x.shape[0])])


def ggml_rows(t: int, n: int, cols: int, gen: torch.Generator) -> GgmlWeight:
    if t in I_QUANTS:                      # no quantizer here: valid random bytes
        return GgmlWeight(gq.random_rows(t, n, cols, gen), t, cols)
    return GgmlWeight(gq.quantize(torch.randn(n, cols, generator=gen) * 0.1, t), t, cols)


@pytest.fixture(params=ISAS)
def pool(request):
    p = CpuPool(kernels.load(request.param), 2, pin=False, small_job_bytes=0)   # threads split even tiny layers
    yield p
    p.close()


@pytest.mark.parametrize("numerics", list(ACT_MODES))
@pytest.mark.parametrize("t", KERNEL_TYPES, ids=gq.type_name)
def test_ggml_linear_rows_are_one_row_steps(pool, t, numerics):
    """Every activation rounding of --ggml-numerics (q8, llama.cpp's q8_0/q8_1/q8_K, float32)."""
    g = torch.Generator().manual_seed(t)
    cols = 512 if gq.block_elems(t) == 256 else 128
    w = ggml_rows(t, 37, cols, g)
    lin = GgmlLinear([w, ggml_rows(gq.Q8_0 if t != gq.Q8_0 else gq.Q4_0, 5, cols, g)], torch.randn(42, generator=g), pool)
    assert pool.lib.ft_set_ggml_act(ACT_MODES[numerics]) == ACT_MODES[numerics]
    try:
        for n in ROWS:
            x = torch.randn(n, cols, generator=g)
            assert torch.equal(lin(x), one_by_one(lin, x)), (gq.type_name(t), numerics, n)
    finally:
        pool.lib.ft_set_ggml_act(ACT_MODES["q8"])


@pytest.mark.parametrize("storage,fmt", [(torch.float32, None), (torch.bfloat16, None), (torch.float16, None),
                                         (torch.bfloat16, "int8")])
@pytest.mark.parametrize("bf16_dot", [False, True], ids=["dot-off", "dot-on"])
def test_float_linear_rows_are_one_row_steps(pool, storage, fmt, bf16_dot):
    g = torch.Generator().manual_seed(3)
    was = bf16_dot_now()
    set_bf16_dot(pool.lib, bf16_dot)
    lin = Linear(torch.randn(37, 96, generator=g), torch.randn(37, generator=g), compute_dtype=torch.float32,
                 storage_dtype=storage, fmt=fmt, pool=pool)
    for n in ROWS:
        x = torch.randn(n, 96, generator=g)
        assert torch.equal(lin(x), one_by_one(lin, x)), (storage, fmt, bf16_dot, n)
    set_bf16_dot(pool.lib, was)


@pytest.mark.parametrize("t", [gq.Q4_1, gq.Q8_0, gq.Q6_K], ids=gq.type_name)
def test_embedding_rows_do_not_depend_on_the_batch(t):
    """The C dequantizer (few ids) and the torch decoders (many) give the same bits."""
    g = torch.Generator().manual_seed(5)
    emb = GgmlEmbedding(ggml_rows(t, 300, 256, g), torch.float32, shared_pool())
    for n in ROWS + (GEMV_TOKENS + 1, 200):
        ids = torch.randint(0, 300, (n,), generator=g)
        assert torch.equal(emb(ids), one_by_one(emb, ids)), (gq.type_name(t), n)


def test_rms_norm_and_rope_one_token_fast_path_match_the_rows_path():
    g = torch.Generator().manual_seed(7)
    heads, kv_heads, d = 4, 2, 32
    rot = Rotary({"rope_theta": 10000.0}, d, 128, torch.float32, "cpu")
    qn, kn = RMSNorm(torch.randn(d, generator=g), 1e-6), RMSNorm(torch.randn(d, generator=g), 1e-6)
    norm = RMSNorm(torch.randn(96, generator=g), 1e-5)
    for n in ROWS:
        x = torch.randn(n, 96, generator=g)
        assert torch.equal(norm(x), one_by_one(norm, x))
        qkv = torch.randn(n, (heads + 2 * kv_heads) * d, generator=g)
        pos = torch.arange(50, 50 + n)
        cos, sin = rot.tables(pos)
        for q_norm, k_norm in ((None, None), (qn, kn)):
            q = qkv[:, :heads * d].reshape(n, heads, d)
            k = qkv[:, heads * d:(heads + kv_heads) * d].reshape(n, kv_heads, d)
            if q_norm is not None:
                q, k = q_norm(q), k_norm(k)
            q, k = rot.apply(q, cos, sin), rot.apply(k, cos, sin)
            for i in range(n):
                q1, k1 = norm_rope_qk(qkv[i:i + 1].contiguous(), heads, kv_heads, d, rot.dim, q_norm, k_norm,
                                      cos[i:i + 1], sin[i:i + 1])
                assert torch.equal(q1[0], q[i]) and torch.equal(k1[0], k[i]), (n, i, q_norm is None)


def _meta(pool, lens: list[int], queries: list[int], block: int = 16) -> AttentionMetadata:
    """One engine step over sequences with `lens` keys each, the last `queries[s]` of them new:
    sequence s's keys sit in its own blocks (s * 8 blocks on), as the model runner lays them out."""
    b, kmax, qmax = len(lens), max(lens), max(queries)
    key_slots = torch.zeros(b, kmax, dtype=torch.long)
    key_pos = torch.full((b, kmax), 1 << 30, dtype=torch.long)
    q_index = torch.full((b, qmax), sum(queries), dtype=torch.long)
    q_pos = torch.full((b, qmax), -1, dtype=torch.long)
    slot_map, flat = [], 0
    for s, (n, q) in enumerate(zip(lens, queries)):
        key_slots[s, :n] = torch.arange(n) + (1 + 8 * s) * block
        key_pos[s, :n] = torch.arange(n)
        q_index[s, :q] = torch.arange(flat, flat + q)
        q_pos[s, :q] = torch.arange(n - q, n)
        slot_map.append(key_slots[s, n - q:n])
        flat += q
    return AttentionMetadata(slot_mapping=torch.cat(slot_map), key_slots=key_slots, key_positions=key_pos,
                             query_index=q_index, query_positions=q_pos, num_tokens=flat,
                             context_lens=torch.tensor(lens), kernel_pool=pool, block_size=block)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
def test_verify_attention_rows_are_decode_steps(pool, kv_dtype):
    """Two sequences verifying 5 and 9 positions at once == each position as its own decode step."""
    g = torch.Generator().manual_seed(11)
    hq, hkv, d = 4, 2, 32
    lens, queries = [40, 70], [5, 9]
    ks = [torch.randn(n, hkv, d, generator=g) for n in lens]
    vs = [torch.randn(n, hkv, d, generator=g) for n in lens]
    qs = [torch.randn(n, hq, d, generator=g) for n in lens]
    cache = KVCache(17 * 16, hkv, d, kv_dtype, "cpu")
    for s, n in enumerate(lens):                 # the context before the step
        pre = _meta(pool, [n], [n])
        cache.write(pre.slot_mapping + 8 * s * 16, ks[s], vs[s])
    meta = _meta(pool, lens, queries)
    sel = [slice(n - q, n) for n, q in zip(lens, queries)]
    got = paged_attention(torch.cat([q[i] for q, i in zip(qs, sel)]), torch.cat([k[i] for k, i in zip(ks, sel)]),
                          torch.cat([v[i] for v, i in zip(vs, sel)]), cache, meta, d ** -0.5)
    want = []
    for s, (n, q) in enumerate(zip(lens, queries)):
        for p in range(n - q, n):
            one = _meta(pool, [p + 1], [1])
            one.key_slots += 8 * s * 16
            one.slot_mapping += 8 * s * 16
            want.append(paged_attention(qs[s][p:p + 1], ks[s][p:p + 1], vs[s][p:p + 1], cache, one, d ** -0.5))
    assert torch.equal(got, torch.cat(want))
