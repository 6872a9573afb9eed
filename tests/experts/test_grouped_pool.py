"""A pool of ggml banks whose layers have different row widths (Q4_K_M's Q6_K / Q4_K ffn_down),
grouped per width with no padding (experts/grouped_pool.py), against the same experts in one
bank padded to the widest row (the layout before the grouping): same bytes per expert, and
every executor and tier gives the padded pool's numbers."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from test_ggml_banks import pad_rows
from tiered_helpers import one_torch_thread  # noqa: F401

from freetoken.experts.memory.cache import ExpertCache
from freetoken.experts.ggml_banks import quantize_ggml
from freetoken.experts.grouped_pool import GroupedPool
from freetoken.experts.execution.host_exec import cpu_executor, make_host_executor
from freetoken.experts.memory.pool import ExpertPool, ExpertSpec
from freetoken.experts.execution.resident import ResidentExperts
from freetoken.experts.execution.tiered import TieredExperts
from freetoken.kernels import variants_here
from freetoken.quant import ggml_quants as gq

E, H, I = 4, 256, 256
# per layer (gate, up, down): Q6_K and Q4_K ffn_down alternating as in Q4_K_M, and one layer of
# legacy types whose gate and up differ in width (banks of their own: neither pads)
LAYER_TYPES = [(gq.Q4_K, gq.Q4_K, gq.Q6_K), (gq.Q4_K, gq.Q4_K, gq.Q4_K), (gq.Q4_K, gq.Q4_K, gq.Q6_K),
               (gq.Q8_0, gq.Q4_0, gq.Q8_0), (gq.Q4_K, gq.Q4_K, gq.Q4_K)]
L = len(LAYER_TYPES)


def layer_banks(seed: int = 0) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [quantize_ggml(torch.randn(E, 2 * I, H, generator=gen) * 0.1, torch.randn(E, H, I, generator=gen) * 0.1,
                          g, u, d) for g, u, d in LAYER_TYPES]


def padded_pool(layers: list[dict]) -> ExpertPool:
    """Every layer in one bank per name, rows zero-padded to the widest."""
    banks = {}
    for k in layers[0]:
        width = max(b[k].shape[-1] for b in layers)
        banks[k] = torch.cat([pad_rows(b[k], width) if b[k].dtype == torch.uint8 else b[k] for b in layers]).contiguous()
    return ExpertPool(banks, len(layers), E, ExpertSpec(H, I, "ggml"))


def grouped_pool(layers: list[dict]) -> GroupedPool:
    """The layers grouped by their banks' row shapes, each group dense."""
    keys = [tuple(b[k].shape[1:] for k in sorted(b)) for b in layers]
    groups = [[m for m, key in enumerate(keys) if key == want] for want in dict.fromkeys(keys)]
    pools = [ExpertPool({k: torch.cat([layers[m][k] for m in ls]).contiguous() for k in layers[0]}, len(ls), E,
                        ExpertSpec(H, I, "ggml")) for ls in groups]
    return GroupedPool(pools, groups)


@pytest.fixture(scope="module")
def pools():
    layers = layer_banks()
    return grouped_pool(layers), padded_pool(layers)


def routing(gen, tokens: int, k: int = 2):
    x = torch.randn(tokens, H, generator=gen)
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(tokens)])
    return x, ids, torch.softmax(torch.randn(tokens, k, generator=gen), -1)


def test_pool_holds_each_layer_in_its_own_width(pools):
    grouped, padded = pools
    assert len(grouped.groups) == 3
    want = sum(E * (I * (gq.row_bytes(g, H) + gq.row_bytes(u, H)) + H * gq.row_bytes(d, I) + 3 * 4)
               for g, u, d in LAYER_TYPES)
    assert grouped.nbytes == want < padded.nbytes
    assert grouped.expert_nbytes == padded.expert_nbytes          # a cache slot holds the widest
    for m in range(L):                                            # flat id -> its layer's rows, as they were
        group, local = grouped.layer_group(m)
        g = grouped.groups[group]
        for e in range(E):
            for k, b in g.banks.items():
                row = b[local * E + e]
                assert torch.equal(row, padded.banks[k][m * E + e][..., :row.shape[-1]]), (m, e, k)


def one_layer_ids(gen, layer: int) -> torch.Tensor:
    """A decode call's ids: one layer's experts (flat ids), one pair skipped (-1)."""
    ids = torch.randint(0, E, (2, 3), generator=gen) + layer * E
    ids[1, 2] = -1
    return ids


@pytest.mark.parametrize("case", ["mixed", "one layer", "one layer, all valid"])
def test_split_ids_maps_every_flat_id_to_its_group(pools, case):
    """Many layers' ids (the numpy split) and one layer's (the decode call's Python split)."""
    grouped, _ = pools
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(-1, L * E, (7, 3), generator=gen) if case == "mixed" else one_layer_ids(gen, 3)
    if case == "one layer, all valid":
        ids[1, 2] = 3 * E + 1
    seen = torch.zeros_like(ids, dtype=torch.bool)
    for group, local in grouped.split_ids(ids):
        mine = local >= 0
        assert not (seen & mine).any()
        seen |= mine
        layers = torch.tensor(grouped.group_layers[group])
        assert torch.equal(layers[local[mine] // E] * E + local[mine] % E, ids[mine])
    assert torch.equal(seen, ids >= 0)


@pytest.mark.parametrize("isa", ["native", "avx2", "portable", "torch"])
def test_cpu_executor_per_layer_bit_identical(pools, isa):
    if isa != "torch" and isa not in variants_here():
        pytest.skip(f"the {isa} kernel build does not run on this CPU")
    grouped, padded = pools
    got = cpu_executor(grouped, isa=isa, num_threads=2)
    want = cpu_executor(padded, isa=isa, num_threads=2)
    gen = torch.Generator().manual_seed(2)
    for tokens in (1, 5):
        for m in range(L):
            x, ids, w = routing(gen, tokens)
            assert torch.equal(got.run(x, ids + m * E, w), want.run(x, ids + m * E, w)), (tokens, m)
            x, ids, w = routing(gen, tokens)           # a decode call of one layer (run_layer), a pair skipped
            ids[-1, -1] = -1
            out, ran = got.run_layer(m, x, ids, w)
            assert torch.equal(out, want.run(x, torch.where(ids >= 0, ids + m * E, -1), w)), (tokens, m)
            assert ran == sorted(set((ids + m * E).reshape(-1).tolist()))
    x = torch.randn(3, H, generator=gen)       # one call over experts of several groups: up to the sum order
    ids = torch.tensor([[0, 5], [9, 17], [13, 2]])
    w = torch.rand(3, 2, generator=gen)
    torch.testing.assert_close(got.run(x, ids, w), want.run(x, ids, w), rtol=1e-5, atol=1e-6)
    got.close()
    want.close()


def test_resident_and_torch_host_bit_identical(pools):
    grouped, padded = pools
    gen = torch.Generator().manual_seed(3)
    res_g, res_p = ResidentExperts(grouped, torch.device("cpu")), ResidentExperts(padded, torch.device("cpu"))
    host_g, host_p = make_host_executor(grouped, prefer_fast=False), make_host_executor(padded, prefer_fast=False)
    for tokens in (1, 6):
        for m in range(L):
            x, ids, w = routing(gen, tokens)
            assert torch.equal(res_g.forward(m, x, ids, w), res_p.forward(m, x, ids, w))
            assert torch.equal(host_g.run(x, ids + m * E, w), host_p.run(x, ids + m * E, w))


def test_cache_slots_hold_the_front_of_each_row(pools):
    grouped, padded = pools
    cache = ExpertCache(grouped, 3, torch.device("cpu"))
    assert {k: b.shape[1:] for k, b in cache.banks.items()} == {k: b.shape[1:] for k, b in padded.banks.items()}
    flat = np.array([1 * E + 2, 3 * E, 0 * E + 1])            # a Q4_K layer, the legacy layer, a Q6_K layer
    cache.ready(cache.install(flat, np.arange(3)), np.arange(3))
    for s, f in enumerate(flat):
        group, local = grouped.layer_group(int(f) // E)
        for k, b in grouped.groups[group].banks.items():
            row = b[local * E + int(f) % E]
            assert torch.equal(cache.banks[k][s][..., :row.shape[-1]], row), (s, k)


@pytest.mark.parametrize("slots", [1, L, 2 * E + 1])
def test_tiered_offload_bit_identical_to_the_padded_pool(pools, slots):
    """offload (every miss filled: the same decisions for both pools), a cache of 1 slot, of
    one slot per layer, and of two whole layers (prefill streams layers)."""
    grouped, padded = pools
    runs = []
    for pool in (grouped, padded):
        gen = torch.Generator().manual_seed(4)
        be = TieredExperts(pool, torch.device("cpu"), slots, "offload", host_executor=make_host_executor(pool, prefer_fast=False))
        outs = []
        for step in range(3):
            tokens = 2 * E if step == 0 else 1
            be.begin_step("prefill" if step == 0 else "decode", tokens)
            for m in range(L):
                outs.append(be.forward(m, *routing(gen, tokens)))
        st = be.stats()["total"]
        be.close()
        runs.append((outs, st))
    (got, st), (want, _) = runs
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert st["fills"] > 0
    if slots >= 2 * E:
        assert st["streamed_layers"] > 0


@pytest.mark.parametrize("policy", ["hybrid", "cpu"])
def test_tiered_hybrid_and_cpu_match_the_padded_pool(pools, policy):
    """The CPU branch on the C kernels: the split between fills and the CPU may differ run to
    run, so the sums agree to the summation order."""
    from freetoken.experts.execution.tiered import CpuExperts
    grouped, padded = pools
    ref = ResidentExperts(padded, torch.device("cpu"))
    be = (TieredExperts(grouped, torch.device("cpu"), 2, "hybrid") if policy == "hybrid"
          else CpuExperts(grouped, torch.device("cpu")))
    gen = torch.Generator().manual_seed(5)
    for step in range(3):
        tokens = 3 if step == 0 else 1
        be.begin_step("prefill" if step == 0 else "decode", tokens)
        for m in range(L):
            x, ids, w = routing(gen, tokens)
            torch.testing.assert_close(be.forward(m, x, ids, w), ref.forward(m, x, ids, w), rtol=1e-4, atol=1e-5)
    be.close()


def test_pin_registers_every_group_in_place(pools):
    grouped, _ = pools
    registered = []
    n = grouped.pin(register=lambda t: registered.append(t.data_ptr()), unregister=lambda t: None, limit=None)
    assert n == grouped.nbytes
    assert sorted(registered) == sorted(b.data_ptr() for b in grouped.all_banks())
    grouped.unpin()
    assert grouped.pinned_bytes == 0


def _real_bytes(pool: GroupedPool) -> list[int]:
    """One expert's bytes per layer, read off its group's banks (not the slot's widest rows)."""
    out = []
    for m in range(pool.num_layers):
        g, local = pool.layer_group(m)
        out.append(sum(b[local * E].nbytes for b in pool.groups[g].banks.values()))
    return out


@pytest.mark.parametrize("policy", ["offload", "hybrid", "cpu"])
def test_bytes_stats_count_each_experts_real_bytes(pools, policy):
    """bytes_copied / cpu_bytes add each filled or CPU-run expert at its own layer's width: the
    narrow layers count less than a slot (the widest group's expert)."""
    from freetoken.experts.execution.tiered import CpuExperts
    grouped, _ = pools
    real = _real_bytes(grouped)
    assert min(real) < grouped.expert_nbytes          # some layers are narrower than a slot
    be = (CpuExperts(grouped, torch.device("cpu")) if policy == "cpu" else
          TieredExperts(grouped, torch.device("cpu"), 3, policy, host_executor=make_host_executor(grouped, prefer_fast=False),
                        cache_policy="lrfu+admit+layer"))     # no prefetch: every copy is a routed fill
    gen = torch.Generator().manual_seed(6)
    for step in range(4):
        tokens = 3 if step == 0 else 1
        be.begin_step("prefill" if step == 0 else "decode", tokens)
        for m in range(L):
            be.forward(m, *routing(gen, tokens))
    st = be.stats()
    be.close()
    moved = cpu = 0
    for m, row in enumerate(st["per_layer"]):
        moved += row["fills"] * real[m]
        cpu += row["cpu_experts"] * real[m]
    tot = st["total"]
    assert tot["cpu_bytes"] == cpu and (policy != "cpu" or cpu > 0)
    if policy == "offload":               # no prefetch, no warm fills: every copy is a fill of its layer
        assert tot["bytes_copied"] == moved > 0
