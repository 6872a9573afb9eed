"""A verify's rows in the decode attention kernel: the k + 1 rows of one sequence (row i reads its
first n + i keys through the same slots) are served together, each key block read once for all of
them. Each row must still get the bits the decode step at its position gets alone, in any batch,
on every kernel path, and float64 attention's values."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from helpers import bf16_rounded_attention

from freetoken import kernels
from freetoken.kernels.pool import CpuPool
from freetoken.layers.attention.paged import attend_rows

ISAS = kernels.variants_here()
POOLS = {}
# decode attention over a bf16 cache: fp32 FMAs, and AMX tiles where they run (kernels/c/attention_amx.c)
MODES = ["fp32"] + (["amx"] if kernels.load().ft_set_att_amx(1) else [])
kernels.load().ft_set_att_amx(0)


def _pool(isa: str, threads: int) -> CpuPool:
    if (isa, threads) not in POOLS:
        POOLS[isa, threads] = CpuPool(kernels.load(isa), threads, small_job_bytes=0)    # split small caches too
    return POOLS[isa, threads]


def _verify(n0: int, rows: int, others: list[int], hq: int, hkv: int, d: int, dtype, gen):
    """A cache and a call's rows: `rows` queries of one sequence (n0 .. n0 + rows - 1 keys, one
    slot row) between sequences of their own slots with `others` keys (half before, half after)."""
    total = n0 + rows + sum(others) + 16
    k, v = (torch.randn(total, hkv, d, generator=gen).to(dtype) for _ in range(2))
    perm = torch.randperm(total - 16, generator=gen) + 16
    seq, start = perm[:n0 + rows - 1], n0 + rows - 1
    lens, slot_rows = [], []
    for n in others:
        lens.append(n)
        slot_rows.append(perm[start:start + n])
        start += n
    half = len(others) // 2
    lens[half:half] = range(n0, n0 + rows)
    slot_rows[half:half] = [seq] * rows
    kmax = max(lens)
    slots = torch.stack([F.pad(s, (0, kmax - len(s))) for s in slot_rows]).contiguous()
    q = torch.randn(len(lens), hq, d, generator=gen)
    return q, k, v, slots, torch.tensor(lens)


def _reference(q, k, v, slots, lens, scale):
    outs = []
    for i, n in enumerate(lens.tolist()):
        s = slots[i, :n]
        keys, values = k[s].double().transpose(0, 1)[None], v[s].double().transpose(0, 1)[None]
        qi = q[i:i + 1].double().transpose(0, 1)[None]
        outs.append(F.scaled_dot_product_attention(qi, keys, values, scale=scale, enable_gqa=True)[0].transpose(0, 1)[0])
    return torch.stack(outs)


def _check(isa, threads, n0, rows, others, shape, dtype, seed, bf16_dot=False, mode="fp32"):
    hq, hkv, d = shape
    pool = _pool(isa, threads)
    gen = torch.Generator().manual_seed(seed)
    q, k, v, slots, lens = _verify(n0, rows, others, hq, hkv, d, dtype, gen)
    scale = d ** -0.5
    if bf16_dot:
        assert pool.lib.ft_set_bf16_dot(1) in (1, 2)
    assert pool.lib.ft_set_att_amx(int(mode == "amx")) == int(mode == "amx" and isa == "native")
    try:
        out = attend_rows(pool, q, k, v, slots, lens, scale)
        for i in range(len(lens)):
            alone = attend_rows(pool, q[i:i + 1], k, v, slots[i:i + 1], lens[i:i + 1], scale)
            assert torch.equal(alone[0], out[i]), (i, lens[i].item())
    finally:
        pool.lib.ft_set_bf16_dot(0)
        pool.lib.ft_set_att_amx(0)
    if not bf16_dot:
        torch.testing.assert_close(out.double(), _reference(q, k, v, slots, lens, scale), atol=2e-6, rtol=2e-5)


@settings(max_examples=24, deadline=None)
@given(isa=st.sampled_from(ISAS), mode=st.sampled_from(MODES), threads=st.integers(1, 3),
       n0=st.one_of(st.integers(1, 40), st.integers(240, 270), st.integers(500, 1300)),
       rows=st.integers(1, 18), others=st.lists(st.integers(1, 600), max_size=3),
       shape=st.sampled_from([(32, 4, 128), (8, 2, 64), (6, 1, 20), (20, 1, 40), (4, 4, 36)]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), seed=st.integers(0, 1 << 20))
def test_verify_rows_get_their_bits_alone(isa, mode, threads, n0, rows, others, shape, dtype, seed):
    """Key counts crossing a chunk (256 keys at 2 threads: the last rows get one more chunk than
    the first), more rows than one item serves (16), group sizes that do and do not divide the
    vector width, any thread count; fp32 FMAs and AMX tiles (on the native build's bf16 cache)."""
    _check(isa, threads, n0, rows, others, shape, dtype, seed, mode=mode if isa == "native" else "fp32")


@pytest.mark.parametrize("isa", ISAS)
def test_verify_rows_whose_chunks_differ(isa):
    """At 3 threads and one KV head a sequence is cut 12 ways in whole blocks: 3450..3461 keys
    cross from 288-key to 320-key chunks inside one verify (two groups, each row its own bits)."""
    _check(isa, 3, 3450, 12, [700], (8, 1, 64), torch.bfloat16, 1)


@pytest.mark.skipif("amx" not in MODES, reason="AMX tiles do not run here (no amx_bf16, or the OS refuses the tile state)")
@pytest.mark.parametrize("threads,n0,rows,others,shape", [
    (3, 3450, 12, [700], (8, 1, 64)),           # two groups of chunks within one verify
    (1, 1600, 16, [9, 1], (32, 4, 128)),        # the dense bench model's shape, a full item of 16 rows
    (2, 1, 18, [], (20, 1, 40)),                # 20 heads a row: tiles holding parts of two rows
    (2, 700, 9, [300, 40], (3, 1, 8)),          # head_dim 8: one zero-padded 32-column chunk
])
def test_verify_rows_on_amx_tiles(threads, n0, rows, others, shape):
    """The AMX path: each row == itself alone bit for bit, and float64 attention within the fp32
    path's tolerance (queries and weights in three exact bf16 parts)."""
    _check("native", threads, n0, rows, others, shape, torch.bfloat16, 3, mode="amx")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("shape", [(32, 4, 128), (20, 1, 40)])
def test_verify_rows_under_bf16_dots(isa, shape):
    """ft_set_bf16_dot(1) (vdpbf16ps where built, emulated otherwise): a verify's rows alike."""
    _check(isa, 2, 700, 9, [300, 40], shape, torch.bfloat16, 2, bf16_dot=True)




@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("shape", [(32, 4, 128), (16, 1, 64), (64, 4, 36), (8, 1, 6)])
@pytest.mark.parametrize("threads", [1, 2])
def test_verify_rows_under_bf16_dots_every_row_count(isa, shape, threads):
    """ft_set_bf16_dot(1) on a bf16 cache, 1..17 rows of one sequence: with G = 8 or 16 query heads
    a KV head the native build scores all of a verify's rows x heads as the lanes of one vdpbf16ps
    tile (attention_lanes.c; an odd row count of G = 8 leaves a ymm, head_dim 6 an odd count of
    column pairs). Each row == itself alone bit for bit (a decode step at its position), and
    float64 attention over the rounded queries and weights; sinks alike (gpt-oss)."""
    hq, hkv, d = shape
    pool = _pool(isa, threads)
    scale = d ** -0.5
    assert pool.lib.ft_set_bf16_dot(1) in (1, 2)
    try:
        for rows in range(1, 18):
            gen = torch.Generator().manual_seed(rows * 31 + d)
            q, k, v, slots, lens = _verify(300 + 37 * rows, rows, [50, 700], hq, hkv, d, torch.bfloat16, gen)
            sinks = torch.randn(hq, generator=gen) if rows % 4 == 1 else None
            out = attend_rows(pool, q, k, v, slots, lens, scale, sinks)
            for i in range(len(lens)):
                alone = attend_rows(pool, q[i:i + 1], k, v, slots[i:i + 1], lens[i:i + 1], scale, sinks)
                assert torch.equal(alone[0], out[i]), (rows, i, lens[i].item())
            if sinks is None:
                ref = bf16_rounded_attention(q, k, v, slots, lens, scale)
                err = (out.double() - ref).abs().max().item()
                # the emulating builds' (the pre-lanes tiles') error alike: up to ~8e-4 at G = 16,
                # against ~3e-3 from the unrounded reference
                assert err < 1.5e-3 * ref.abs().max().item(), (rows, err)
    finally:
        pool.lib.ft_set_bf16_dot(0)
