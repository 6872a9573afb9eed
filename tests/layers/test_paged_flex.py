"""The in-place paged attention (paged_flex.py, the device path, forced here on CPU tensors)
against dense float64 softmax attention per sequence and query: ragged lengths, prefill chunks
and decode tokens in one batch, a prefix block shared by two sequences, windows, sinks, MLA's
latent rows (values a column view of the keys) and DSA's selected keys."""
import pytest
import torch
import torch.nn.functional as F

from freetoken.layers.attention.paged import AttentionMetadata, KVCache, paged_attention
from freetoken.layers.attention.sinks import paged_attention_sinks

BS = 4


def paged_step(ctx_lens, q_lens, num_blocks=40, gen=None, share_first_block=False, device="cpu"):
    """Block tables over scattered physical blocks (block 0 = null), as the runner builds them."""
    perm = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    tables = []
    for i, n in enumerate(ctx_lens):
        need = -(-n // BS)
        if share_first_block and i == 1:
            tables.append([tables[0][0]] + [perm.pop() for _ in range(need - 1)])
        else:
            tables.append([perm.pop() for _ in range(need)])
    kmax, qmax, n_total = max(ctx_lens), max(q_lens), sum(q_lens)
    key_slots, slot_map, qidx, qpos, off = [], [], [], [], 0
    for table, n, q in zip(tables, ctx_lens, q_lens):
        slots = (torch.tensor(table)[:, None] * BS + torch.arange(BS)).reshape(-1)[:n]
        key_slots.append(F.pad(slots, (0, kmax - n)))
        slot_map.append(slots[n - q:])
        qidx.append(F.pad(torch.arange(off, off + q), (0, qmax - q), value=n_total))
        qpos.append(F.pad(torch.arange(n - q, n), (0, qmax - q), value=-1))
        off += q
    ctx = torch.tensor(ctx_lens)
    kp = torch.arange(kmax).expand(len(ctx_lens), kmax)
    meta = AttentionMetadata(
        slot_mapping=torch.cat(slot_map).to(device), key_slots=torch.stack(key_slots).to(device),
        key_positions=torch.where(kp < ctx[:, None], kp, 1 << 30).to(device),
        query_index=torch.stack(qidx).to(device), query_positions=torch.stack(qpos).to(device),
        num_tokens=n_total, context_lens=ctx, block_size=BS, paged=True)
    return meta


def reference(q, keys, values, meta, scale, window=None, sinks=None, selected=None):
    """float64, one (sequence, query) at a time over its cached keys (cache already written)."""
    out = torch.zeros(q.shape[0], q.shape[1], values.shape[-1], dtype=torch.float64)
    g = q.shape[1] // keys.shape[1]
    for b, n in enumerate(meta.context_lens.tolist()):
        slots = meta.key_slots[b, :n].cpu()
        k, v = keys.cpu()[slots].double(), values.cpu()[slots].double()
        for j in range(meta.query_index.shape[1]):
            p = int(meta.query_positions[b, j])
            if p < 0:
                continue
            t = int(meta.query_index[b, j])
            vis = torch.arange(n) <= p
            if window is not None:
                vis &= torch.arange(n) > p - window
            if selected is not None:
                vis &= selected[b, 0, j, :n].cpu()
            for h in range(q.shape[1]):
                s = (k[:, h // g] @ q[t, h].cpu().double()) * scale
                s = s.masked_fill(~vis, float("-inf"))
                if sinks is not None:
                    s = torch.cat([s, sinks[h].cpu().double().view(1)])
                w = torch.softmax(s, 0)[:n]
                out[t, h] = w @ v[:, h // g]
    return out


CASES = [((9, 1), (9, 1)), ((13, 6, 21), (1, 6, 1)), ((7, 17), (3, 1)), ((1, 30, 2), (1, 30, 1))]


def _step(ctx_lens, q_lens, hq, hkv, d, dv, gen, device="cpu", **kw):
    meta = paged_step(ctx_lens, q_lens, gen=gen, device=device, **kw)
    cache = KVCache(40 * BS, hkv, d, torch.float32, device)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    cache.v = torch.randn(40 * BS, hkv, dv, generator=gen).to(device)
    n = meta.num_tokens
    q = torch.randn(n, hq, d, generator=gen).to(device)
    k = torch.randn(n, hkv, d, generator=gen).to(device)
    v = torch.randn(n, hkv, dv, generator=gen).to(device)
    return meta, cache, q, k, v


@pytest.mark.parametrize("ctx_lens,q_lens", CASES)
@pytest.mark.parametrize("window", [None, 5])
def test_paged_matches_dense_reference(ctx_lens, q_lens, window):
    gen = torch.Generator().manual_seed(len(ctx_lens) * 7 + (window or 0))
    meta, cache, q, k, v = _step(ctx_lens, q_lens, 4, 2, 8, 8, gen)
    out = paged_attention(q, k, v, cache, meta, 0.35, window)
    assert "paged" in str(list(meta.masks))            # the in-place path ran, not the gather
    torch.testing.assert_close(out.double(), reference(q, cache.k, cache.v, meta, 0.35, window), atol=1e-5, rtol=1e-5)


def test_shared_prefix_block_and_batch_rows_stay_separate():
    gen = torch.Generator().manual_seed(3)
    meta, cache, q, k, v = _step((10, 7), (1, 1), 2, 1, 8, 8, gen, share_first_block=True)
    assert meta.key_slots[0, 0] == meta.key_slots[1, 0]
    out = paged_attention(q, k, v, cache, meta, 0.5)
    torch.testing.assert_close(out.double(), reference(q, cache.k, cache.v, meta, 0.5), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 6])
def test_paged_sinks_match_reference(window):
    gen = torch.Generator().manual_seed(11)
    meta, cache, q, k, v = _step((12, 5, 19), (4, 1, 1), 4, 2, 8, 8, gen)
    sinks = torch.randn(4, generator=gen)
    out = paged_attention_sinks(q, k, v, cache, meta, 0.4, sinks, window)
    torch.testing.assert_close(out.double(), reference(q, cache.k, cache.v, meta, 0.4, window, sinks),
                               atol=1e-5, rtol=1e-5)


def test_latent_rows_as_keys_and_a_column_view_as_values():
    """MLA's absorbed form: one shared head, keys = rows[:, :row], values = rows[:, :rank]."""
    from freetoken.layers.attention.paged import gather_queries, in_place, scatter
    gen = torch.Generator().manual_seed(5)
    meta = paged_step((11, 3, 8), (1, 3, 1), gen=gen)
    rows = torch.randn(40 * BS, 1, 24, generator=gen)          # [latent 16 | rope 6 | indexer 2]
    q = torch.randn(meta.num_tokens, 4, 22, generator=gen)
    keys, values = rows[..., :22], rows[..., :16]
    out = scatter(in_place(gather_queries(q, meta), keys, values, meta, 0.3), meta)
    torch.testing.assert_close(out.double(), reference(q, keys, values, meta, 0.3), atol=1e-5, rtol=1e-5)
    # DSA: only the indexer's selected keys (a causal subset) are attended
    selected = torch.rand(3, 1, 3, 11, generator=gen) < 0.5
    selected[..., 0] = True
    out = scatter(in_place(gather_queries(q, meta), keys, values, meta, 0.3, selected=selected), meta)
    torch.testing.assert_close(out.double(), reference(q, keys, values, meta, 0.3, selected=selected),
                               atol=1e-5, rtol=1e-5)


def test_cpu_default_is_not_the_paged_path():
    gen = torch.Generator().manual_seed(1)
    meta, cache, q, k, v = _step((9, 4), (1, 1), 2, 2, 8, 8, gen)
    meta.paged = None
    assert not meta.use_paged(q)


@pytest.mark.cuda
@pytest.mark.parametrize("ctx_lens,q_lens", CASES)
def test_cuda_paged_matches_cpu(ctx_lens, q_lens):
    gen = torch.Generator().manual_seed(9)
    meta, cache, q, k, v = _step(ctx_lens, q_lens, 4, 2, 16, 16, gen)
    want = paged_attention(q, k, v, cache, meta, 0.25, 6)
    gen = torch.Generator().manual_seed(9)
    meta_c, cache_c, qc, kc, vc = _step(ctx_lens, q_lens, 4, 2, 16, 16, gen, device="cuda")
    meta_c.paged = None                                    # the CUDA default
    assert meta_c.use_paged(qc)
    got = paged_attention(qc, kc, vc, cache_c, meta_c, 0.25, 6)
    from freetoken.layers.attention.paged import paged_flex
    assert not paged_flex._broken, "the compiled kernel failed: the gathered fallback ran"
    torch.testing.assert_close(got.cpu(), want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss", "deepseek_v3"])
def test_engine_logits_with_the_paged_path_forced(tiny_dir, monkeypatch, arch):
    """A whole model (full, window+sinks, MLA layers) scores the same through the in-place path."""
    from freetoken import LLM
    model = tiny_dir(arch, layers=2, experts=8, top_k=2)
    prompt = list(range(5, 40))

    def score():
        llm = LLM(str(model), dtype="float32")
        try:
            return llm.score(prompt), llm.generate([prompt[:9]], _greedy())[0].token_ids
        finally:
            llm.close()

    want = score()
    monkeypatch.setattr(AttentionMetadata, "use_paged", lambda self, q: self.block_size > 0)
    got = score()
    torch.testing.assert_close(got[0], want[0], atol=1e-4, rtol=1e-4)
    assert got[1] == want[1]


def _greedy():
    from freetoken.sampling_params import SamplingParams
    return SamplingParams(max_tokens=5, temperature=0.0)
