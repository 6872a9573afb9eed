"""The C decode attention over the paged cache against torch SDPA / the sinks reference, and the
C RMSNorm against torch's."""
import pytest
import torch
import torch.nn.functional as F
from helpers import bf16_rounded_attention

from freetoken import kernels
from freetoken.kernels.pool import CpuPool
from freetoken.layers.attention.paged import AttentionMetadata, KVCache, paged_attention
from freetoken.layers.norm import rms_norm
from freetoken.layers.attention.sinks import attend_with_sinks, paged_attention_sinks


POOL = CpuPool(kernels.load(), 2, small_job_bytes=0)      # split even these small caches
# every kernel path this CPU runs (the AVX2 library is built on AVX-512 machines too)
ISAS = kernels.variants_here()


def _decode_step(lens, hq, hkv, d, dtype, gen, pool=POOL):
    """A cache holding each sequence's earlier keys on scattered slots, and one new token each."""
    rows = max(512, sum(lens) + 64)
    cache = KVCache(rows, hkv, d, dtype, "cpu")
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    perm = torch.randperm(rows - 12, generator=gen) + 12       # slots 0..11: null block, never used
    kmax, key_slots, start = max(lens), [], 0
    for n in lens:
        key_slots.append(F.pad(perm[start:start + n], (0, kmax - n)))
        start += n
    key_slots = torch.stack(key_slots)
    ctx = torch.tensor(lens)
    b = len(lens)
    meta = AttentionMetadata(
        slot_mapping=key_slots[torch.arange(b), ctx - 1], key_slots=key_slots,
        key_positions=torch.where(torch.arange(kmax) < ctx[:, None], torch.arange(kmax), 1 << 40),
        query_index=torch.arange(b)[:, None], query_positions=(ctx - 1)[:, None], num_tokens=b,
        context_lens=ctx, kernel_pool=pool)
    q = torch.randn(b, hq, d, generator=gen)
    k, v = torch.randn(b, hkv, d, generator=gen).to(dtype), torch.randn(b, hkv, d, generator=gen).to(dtype)
    return q, k, v, cache, meta


def _reference(q, cache, meta, scale, sinks=None):
    """Per sequence: float64 attention over its keys read from the (already written) cache."""
    outs = []
    for i, n in enumerate(meta.context_lens.tolist()):
        s = meta.key_slots[i, :n]
        keys, values = cache.k[s].double().transpose(0, 1)[None], cache.v[s].double().transpose(0, 1)[None]
        qi = q[i:i + 1].double().transpose(0, 1)[None]
        if sinks is None:
            o = F.scaled_dot_product_attention(qi, keys, values, scale=scale, enable_gqa=True)[0].transpose(0, 1)
        else:
            mask = torch.ones(1, 1, 1, n, dtype=torch.bool)
            o = attend_with_sinks(qi, keys, values, mask, sinks, scale)[0].double()   # computes in fp32
        outs.append(o[0])
    return torch.stack(outs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d", [(8, 2, 64), (4, 4, 36), (6, 1, 20), (6, 2, 48)])
def test_decode_kernel_matches_reference(dtype, hq, hkv, d):
    gen = torch.Generator().manual_seed(hq * d)
    q, k, v, cache, meta = _decode_step([1, 37, 5, 130], hq, hkv, d, dtype, gen)
    assert meta.decode_kernel(q, cache.k.dtype, None)
    out = paged_attention(q, k, v, cache, meta, d ** -0.5)
    ref = _reference(q, cache, meta, d ** -0.5)
    assert torch.equal(cache.k[meta.slot_mapping], k) and torch.equal(cache.v[meta.slot_mapping], v)
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=2e-5)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_kernel_path_at_long_context(isa, dtype):
    """Split-K over many chunks (one 20k-key sequence beside short ones), each ISA path built
    here, against float64 attention; sinks too."""
    pool = CpuPool(kernels.load(isa), 3, small_job_bytes=0)
    gen = torch.Generator().manual_seed(11)
    q, k, v, cache, meta = _decode_step([20000, 1, 257, 3000], 16, 2, 128, dtype, gen, pool)
    out = paged_attention(q, k, v, cache, meta, 128 ** -0.5)
    torch.testing.assert_close(out.double(), _reference(q, cache, meta, 128 ** -0.5), atol=2e-6, rtol=2e-5)
    sinks = torch.randn(16, generator=gen) * 3
    out = paged_attention_sinks(q, k, v, cache, meta, 128 ** -0.5, sinks)
    torch.testing.assert_close(out.double(), _reference(q, cache, meta, 128 ** -0.5, sinks), atol=2e-6, rtol=2e-5)
    pool.close()


def _row(meta, i: int) -> AttentionMetadata:
    """Row i of a decode step's metadata as a step of its own."""
    n = int(meta.context_lens[i])
    return AttentionMetadata(
        slot_mapping=meta.slot_mapping[i:i + 1], key_slots=meta.key_slots[i:i + 1, :n],
        key_positions=meta.key_positions[i:i + 1, :n], query_index=torch.zeros(1, 1, dtype=torch.long),
        query_positions=meta.query_positions[i:i + 1], num_tokens=1, context_lens=meta.context_lens[i:i + 1],
        kernel_pool=meta.kernel_pool)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_gets_its_bits_alone_in_any_batch(threads, dtype):
    """Batch invariance past the split-K threshold: a sequence's chunks follow its own key count,
    so each row of a batch (a verify's drafted positions: 1100..1108 keys, beside other lengths)
    equals that row run alone, bit for bit, and all agree with float64 attention."""
    pool = CpuPool(kernels.load(), threads, small_job_bytes=0)
    gen = torch.Generator().manual_seed(threads)
    lens = [300, 1] + list(range(1100, 1109)) + [5000, 257]
    q, k, v, cache, meta = _decode_step(lens, 32, 4, 128, dtype, gen, pool)
    out = paged_attention(q, k, v, cache, meta, 128 ** -0.5)
    torch.testing.assert_close(out.double(), _reference(q, cache, meta, 128 ** -0.5), atol=2e-6, rtol=2e-5)
    for i in range(len(lens)):
        one = paged_attention(q[i:i + 1], k[i:i + 1], v[i:i + 1], cache, _row(meta, i), 128 ** -0.5)
        assert torch.equal(one[0], out[i]), (i, lens[i])
    pool.close()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d", [(16, 1, 80), (20, 1, 40), (14, 2, 96), (24, 2, 64), (3, 1, 8), (32, 4, 128)])
def test_every_kernel_path_odd_shapes(isa, dtype, hq, hkv, d):
    """Group sizes that do and do not divide the vector width (16, 20, 7, 12, 3, 8 query heads per
    KV head), head dims that are not multiples of the 32-column slices, ragged lengths."""
    pool = CpuPool(kernels.load(isa), 2, small_job_bytes=0)
    gen = torch.Generator().manual_seed(hq * 1000 + d)
    q, k, v, cache, meta = _decode_step([1, 33, 70, 300, 17], hq, hkv, d, dtype, gen, pool)
    out = paged_attention(q, k, v, cache, meta, d ** -0.5)
    torch.testing.assert_close(out.double(), _reference(q, cache, meta, d ** -0.5), atol=2e-6, rtol=2e-5)
    pool.close()


@pytest.mark.parametrize("isa", ISAS)
def test_wide_score_range_flushes_nothing_that_counts(isa):
    """Scores spanning far more than exp's range (softmax weights down to 1e-38 and below, where a
    denormal accumulator would appear): still the float64 attention."""
    pool = CpuPool(kernels.load(isa), 2, small_job_bytes=0)
    gen = torch.Generator().manual_seed(5)
    q, k, v, cache, meta = _decode_step([400, 1000], 8, 1, 64, torch.bfloat16, gen, pool)
    q = q * 40                                   # scores ~N(0, 40^2): a range of hundreds
    out = paged_attention(q, k, v, cache, meta, 64 ** -0.5)
    torch.testing.assert_close(out.double(), _reference(q, cache, meta, 64 ** -0.5), atol=2e-6, rtol=2e-5)
    pool.close()


AMX = kernels.load().ft_set_att_amx(1) == 1      # the AMX attention runs here (switched per test)
kernels.load().ft_set_att_amx(0)


@pytest.mark.skipif(not AMX, reason="AMX tiles do not run here (no amx_bf16, or the OS refuses the tile state)")
@pytest.mark.parametrize("hq,hkv,d,lens,scale_q", [
    (32, 4, 128, [300, 1] + list(range(1100, 1105)) + [5000, 257], 1.0),    # batch invariance past split-K
    (16, 1, 80, [1, 33, 70, 300, 17], 1.0), (20, 1, 40, [1, 33, 70, 300, 17], 1.0),
    (14, 2, 96, [1, 33, 70, 300, 17], 1.0), (3, 1, 8, [1, 33, 70, 300, 17], 1.0),
    (8, 1, 64, [400, 1000], 40.0),              # test_wide_score_range_flushes_nothing_that_counts's case
])
def test_amx_attention_matches_reference_and_rows_alone(hq, hkv, d, lens, scale_q):
    """ft_set_att_amx(1) over a bf16 cache: float64 attention within the fp32 path's tolerance
    (with sinks too), and every row of a batch == that row alone, bit for bit (a plain decode step
    and a verify row of the same position take the same path)."""
    lib = kernels.load()
    pool = CpuPool(lib, 3, small_job_bytes=0)
    gen = torch.Generator().manual_seed(5 if scale_q != 1 else hq * 1000 + d)
    q, k, v, cache, meta = _decode_step(lens, hq, hkv, d, torch.bfloat16, gen, pool)
    q = q * scale_q
    assert lib.ft_set_att_amx(1) == 1
    try:
        out = paged_attention(q, k, v, cache, meta, d ** -0.5)
        torch.testing.assert_close(out.double(), _reference(q, cache, meta, d ** -0.5), atol=2e-6, rtol=2e-5)
        for i in range(len(lens)):
            one = paged_attention(q[i:i + 1], k[i:i + 1], v[i:i + 1], cache, _row(meta, i), d ** -0.5)
            assert torch.equal(one[0], out[i]), (i, lens[i])
        sinks = torch.randn(hq, generator=gen) * 3
        out = paged_attention_sinks(q, k, v, cache, meta, d ** -0.5, sinks)
        torch.testing.assert_close(out.double(), _reference(q, cache, meta, d ** -0.5, sinks), atol=2e-6, rtol=2e-5)
    finally:
        lib.ft_set_att_amx(0)
        pool.close()


def test_decode_kernel_with_sinks_matches_reference():
    gen = torch.Generator().manual_seed(7)
    q, k, v, cache, meta = _decode_step([3, 64, 1], 8, 2, 32, torch.float32, gen)
    sinks = torch.randn(8, generator=gen) * 3
    out = paged_attention_sinks(q, k, v, cache, meta, 32 ** -0.5, sinks)
    torch.testing.assert_close(out.double(), _reference(q, cache, meta, 32 ** -0.5, sinks), atol=2e-6, rtol=2e-5)


def test_decode_kernel_declines_what_it_does_not_cover():
    gen = torch.Generator().manual_seed(8)
    q, k, v, cache, meta = _decode_step([20, 9], 4, 2, 16, torch.float32, gen)
    assert not meta.decode_kernel(q, cache.k.dtype, window=8)      # a window cut: SDPA with a mask
    assert not meta.decode_kernel(q.bfloat16(), cache.k.dtype, None)
    meta.kernel_pool = None
    assert not meta.decode_kernel(q, cache.k.dtype, None)


def test_rms_norm_kernel_matches_torch():
    gen = torch.Generator().manual_seed(9)
    for shape in ((1, 2048), (3, 5, 36), (7, 13)):
        x, w = torch.randn(shape, generator=gen), torch.randn(shape[-1], generator=gen)
        ref = w.double() * F.rms_norm(x.double(), (shape[-1],), eps=1e-6)
        torch.testing.assert_close(rms_norm(x, w, 1e-6).double(), ref, atol=1e-6, rtol=1e-5)


def test_decode_steps_leave_torch_threads_as_they_were(tiny_dir):
    """The pure-CPU runner drops torch to one thread inside decode steps only."""
    from freetoken import LLM, SamplingParams
    before = torch.get_num_threads()
    llm = LLM(str(tiny_dir("qwen3_moe")), dtype="float32", num_threads=2)
    n = torch.get_num_threads()
    llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, temperature=0.0))
    assert torch.get_num_threads() == n
    torch.set_num_threads(before)


def test_bf16_kv_cache_under_fp32_compute(tiny_dir):
    """A bf16 checkpoint keeps K/V in bf16 while activations are fp32: decode steps (C kernel
    over bf16 rows) see the logits a full prefill over the same tokens computes (SDPA over the
    converted keys), and both stay close to an fp32 engine."""
    from freetoken import LLM, SamplingParams
    d = str(tiny_dir("qwen3_moe", dtype="bfloat16"))
    llm = LLM(d, dtype="bfloat16", compute_dtype="float32")
    assert next(iter(llm.engine.runner.kv.values())).k.dtype == torch.bfloat16
    prompt, seen = list(range(5, 16)), []
    out = llm.generate([prompt], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True,
                                                logits_processors=[lambda ids, lg: seen.append(lg.clone()) or lg]))[0]
    full = llm.score(prompt + out.token_ids)[len(prompt) - 1:len(prompt) - 1 + len(seen)]
    assert ((torch.stack(seen) - full).abs().max() / full.abs().max()) < 1e-5   # same bf16 keys either way
    ref = LLM(d, dtype="float32").score(prompt + out.token_ids)
    got = llm.score(prompt + out.token_ids)
    assert ((got - ref).abs().max() / ref.abs().max()) < 2e-2




@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("hq,hkv,d", [(32, 4, 128), (16, 1, 80), (20, 1, 40), (6, 2, 48), (8, 8, 64)])
def test_bf16_switch_matches_float64_reference_of_rounded_q_and_weights(isa, hq, hkv, d):
    """ft_set_bf16_dot(1) with a bf16 cache: vdpbf16ps scores and values where the build has it
    and the group fits (G divides 16 / G <= 16), the same rounding emulated otherwise; against
    float64 attention over bf16-rounded q and softmax numerators, split-K (3000 keys) included.
    An fp32 cache stays exact."""
    lib = kernels.load(isa)
    pool = CpuPool(lib, 2, small_job_bytes=0)
    gen = torch.Generator().manual_seed(hq * 100 + d)
    try:
        assert lib.ft_set_bf16_dot(1) in (1, 2)
        q, k, v, cache, meta = _decode_step([1, 33, 70, 300, 17, 3000], hq, hkv, d, torch.bfloat16, gen, pool)
        out = paged_attention(q, k, v, cache, meta, d ** -0.5).double()
        ref = bf16_rounded_attention(q, cache.k, cache.v, meta.key_slots, meta.context_lens, d ** -0.5)
        exact = _reference(q, cache, meta, d ** -0.5)
        err, err_exact = (out - ref).abs().max().item(), (out - exact).abs().max().item()
        assert err < 3e-4 * ref.abs().max().item(), (err, err_exact)     # the exact reference is ~1e-3 off
        assert err_exact < 3e-2 * exact.abs().max().item()                  # bf16 arithmetic, as llama.cpp's
        q, k, v, cache, meta = _decode_step([1, 33, 300], hq, hkv, d, torch.float32, gen, pool)
        out = paged_attention(q, k, v, cache, meta, d ** -0.5)
        torch.testing.assert_close(out.double(), _reference(q, cache, meta, d ** -0.5), atol=2e-6, rtol=2e-5)
    finally:
        lib.ft_set_bf16_dot(0)
        pool.close()
