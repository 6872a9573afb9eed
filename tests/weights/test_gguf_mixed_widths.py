"""A Q4_K_M-like GGUF (ffn_down Q6_K in even layers, Q4_K in odd ones): the expert pool holds
each layer in its own row width (one pool per width, experts/grouped_pool.py), its bytes are the
file's expert bytes, and every backend and tier gives the logits of the same experts in one
bank padded to the widest row (the layout before the grouping)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from gguf_rewrite import q4_k_m, rewrite

from freetoken import LLM
from freetoken.experts.memory.pool import ExpertPool
from freetoken.memory.model_size import read_model_shape
from freetoken.memory.plan import expert_nbytes
from freetoken.weights.gguf.reader import GgufFile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from model_checks import ids_for  # noqa: E402


@pytest.fixture(scope="module")
def mixed_gguf(tiny_dir, to_gguf, tmp_path_factory):
    d = tiny_dir("qwen3_moe", hidden=256, experts=4, moe_intermediate_size=256, layers=3)
    return rewrite(to_gguf(d, "f32"), tmp_path_factory.mktemp("mixed") / "m.gguf", q4_k_m)


def padded(pool) -> ExpertPool:
    """The grouped pool's experts in one bank per name, every row zero-padded to the widest."""
    E, n = pool.num_experts, pool.num_layers * pool.num_experts
    banks = {k: torch.zeros((n, *shape), dtype=dt) for k, (shape, dt) in pool.slot_rows().items()}
    for g, layers in zip(pool.groups, pool.group_layers):
        for j, m in enumerate(layers):
            for k, b in g.banks.items():
                src = b[j * E:(j + 1) * E]
                banks[k][m * E:(m + 1) * E, ..., :src.shape[-1]] = src
    return ExpertPool(banks, pool.num_layers, E, pool.spec)


def test_pool_bytes_are_the_files_expert_bytes(mixed_gguf):
    ck = GgufFile(mixed_gguf)
    pool = ck.prebuilt_experts()
    assert len(pool.groups) == 2
    in_file = sum(t.nbytes for n, (_, t) in ck.tensors_by_name.items() if "_exps." in n)
    type_ids = sum(g.banks[k].nbytes for g in pool.groups for k in ("gate_up_types", "down_types"))
    assert pool.nbytes - type_ids == in_file
    assert padded(pool).nbytes > pool.nbytes
    from freetoken.loading.disk_layout import gguf_layout
    layout = gguf_layout(ck)                         # the disk tier's pool: the same bytes, slots the widest
    assert layout.nbytes == pool.nbytes and layout.expert_nbytes == pool.expert_nbytes
    shape = read_model_shape(mixed_gguf)             # the memory plan counts the same bytes
    assert shape.prebuilt_pool_bytes == pool.nbytes
    assert expert_nbytes(shape, "ggml") == pool.expert_nbytes == max(g.expert_nbytes for g in pool.groups)
    llm = LLM(str(mixed_gguf), dtype="float32")
    items = {i.name: i for i in llm.engine.memory_plan.items}
    assert items["expert pool"].nbytes == llm.engine.model.pool.nbytes == pool.nbytes
    llm.close()


def _logits(path, pad: bool, monkeypatch, **opts):
    if pad:
        orig = GgufFile.prebuilt_experts
        monkeypatch.setattr(GgufFile, "prebuilt_experts", lambda self: padded(orig(self)))
    llm = LLM(str(path), dtype="float32", **opts)
    try:
        return llm.score(ids_for(23, seed=3))
    finally:
        llm.close()
        monkeypatch.undo()


BACKENDS = [("resident", None), ("offload", 1), ("offload", 3), ("offload", 9), ("hybrid", 2)]


@pytest.mark.parametrize("backend,slots", BACKENDS, ids=[f"{b}-{s}" for b, s in BACKENDS])
def test_backends_match_the_padded_pool(mixed_gguf, monkeypatch, backend, slots):
    """resident; offload with 1 slot, one per layer, two whole layers (+1: prefill streams);
    hybrid (its split between fills and the CPU varies: equal up to the summation order)."""
    opts = dict(moe_backend=backend, **({"expert_cache_slots": slots} if slots else {}))
    got = _logits(mixed_gguf, False, monkeypatch, **opts)
    want = _logits(mixed_gguf, True, monkeypatch, **opts)
    if backend == "hybrid":
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    else:
        assert torch.equal(got, want)


def test_cpu_kernels_match_the_padded_pool_under_every_choice(mixed_gguf, monkeypatch, cpu_choice):
    got = _logits(mixed_gguf, False, monkeypatch, **cpu_choice)
    assert torch.equal(got, _logits(mixed_gguf, True, monkeypatch, **cpu_choice))


def test_disk_tier_counts_each_experts_real_bytes(mixed_gguf):
    """The disk tier's cpu_bytes add each expert run at its own layer's width (the prebuilt
    pool's group), not the host cache slot's (the widest); a host cache resize keeps counting so."""
    pool = GgufFile(mixed_gguf).prebuilt_experts()
    real = [pool.groups[g].expert_nbytes for g, _ in map(pool.layer_group, range(pool.num_layers))]
    assert min(real) < pool.expert_nbytes
    llm = LLM(str(mixed_gguf), dtype="float32", host_cache_slots=3)
    try:
        llm.score(ids_for(23, seed=3))
        llm.engine.resize_memory(host_cache_gib=pool.num_layers * pool.expert_nbytes / 2**30)
        llm.score(ids_for(23, seed=4))
        st = llm.expert_stats()
    finally:
        llm.close()
    want = sum(row["cpu_experts"] * real[m] for m, row in enumerate(st["per_layer"]))
    assert st["total"]["cpu_bytes"] == want > 0
    assert st["host_cache"]["slots"] == pool.num_layers
