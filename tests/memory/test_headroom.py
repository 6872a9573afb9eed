"""The plan's budget: host memory less a stated headroom (default max(10%, 2 GiB), an option
to change it); sizes that do not move with what happens to be free at launch; pinned bytes."""
from __future__ import annotations

import pytest

from freetoken.config import EngineConfig
from freetoken.memory import plan as plan_mod
from freetoken.memory.model_size import read_model_shape
from freetoken.memory.plan import host_budget, host_headroom, make_plan
from freetoken.memory.probe import GiB, MachineMemory


def test_default_headroom_is_ten_percent_or_two_gib():
    assert host_headroom(MachineMemory(24 * GiB, 0, "t")) == int(2.4 * GiB)
    assert host_headroom(MachineMemory(8 * GiB, 0, "t")) == 2 * GiB
    cfg = EngineConfig(model="x", memory_headroom_gib=5)
    assert host_budget(MachineMemory(24 * GiB, 0, "t"), cfg) == 19 * GiB


def test_bad_headroom_is_refused():
    with pytest.raises(Exception, match="memory_headroom_gib"):
        EngineConfig(model="x", memory_headroom_gib=-1)


def test_sizes_do_not_move_with_momentary_free_memory(tiny_dir):
    """The same machine at launches with 30% .. 100% of its budget free: the same options
    (prefill chunk, max_model_len, KV, caches) every time; a line when free < planned."""
    src = tiny_dir("qwen3_moe")
    shape = read_model_shape(src)
    cfg = EngineConfig(model=str(src), dtype="float32", max_model_len=10**6, kv_cache_gib=64,
                       max_num_batched_tokens=8192)
    total = int(2.6 * GiB)
    seen = []
    for frac in (0.3, 0.5, 0.7, 0.9, 1.0):
        resolved, plan = make_plan(cfg, shape, MachineMemory(total, int(frac * total), "test"))
        seen.append((resolved.max_num_batched_tokens, resolved.max_model_len, resolved.kv_blocks))
        low = [w for w in plan.warnings if "free now" in w]
        assert len(low) == (1 if frac * total < plan.used("host") else 0)
        assert plan.used("host") <= plan.available["host"] == total - 2 * GiB
    assert len(set(seen)) == 1


def test_headroom_option_changes_the_budget(tiny_dir):
    src = tiny_dir("qwen3_moe")
    shape = read_model_shape(src)
    m = MachineMemory(8 * GiB, 8 * GiB, "test")
    _, a = make_plan(EngineConfig(model=str(src)), shape, m)
    _, b = make_plan(EngineConfig(model=str(src), memory_headroom_gib=6), shape, m)
    assert a.available["host"] == 6 * GiB and b.available["host"] == 2 * GiB
    assert "headroom 6.00 GiB" in b.table()


def test_plan_shows_pinned_bytes_on_cuda(tiny_dir, monkeypatch):
    src = tiny_dir("qwen3_moe")
    shape = read_model_shape(src)
    m = MachineMemory(16 * GiB, 16 * GiB, "test", 8 * GiB, 8 * GiB)
    from freetoken.experts.memory import pinning
    monkeypatch.setattr(pinning, "memlock_limit", lambda: None)
    cfg = EngineConfig(model=str(src), device="cuda", moe_backend="hybrid", expert_cache_slots=4)
    _, plan = make_plan(cfg, shape, m)
    pool = next(i.nbytes for i in plan.items if i.name == "expert pool")
    page = pinning.page_size()
    # cudaHostRegister locks whole pages: the pool rounded up, one more page per bank at most
    assert pool > 0 and plan.to_json()["pinned_bytes"] == plan.pinned == -(-pool // page) * page + 6 * page
    assert "pinned (in place)" in plan.table()
    monkeypatch.setattr(pinning, "memlock_limit", lambda: 64 << 10)      # ulimit -l 64
    _, plan = make_plan(cfg, shape, m)
    assert plan.pinned == 0 and sum("ulimit -l" in w for w in plan.warnings) == 1
    _, plan = make_plan(EngineConfig(model=str(src)), shape, m)            # CPU: nothing pinned
    assert plan.pinned == 0 and "pinned" not in plan.table()


def test_cuda_plan_counts_checkpoints_in_pinned_power_of_two_blocks(tiny_dir, monkeypatch):
    """A hybrid (recurrent-state) model on CUDA: each state part's snapshot is one pinned block of
    PyTorch's caching host allocator, rounded up to a power of two; the plan counts the rounding
    as host memory and in the pinned bytes."""
    from freetoken.experts.memory import pinning
    monkeypatch.setattr(pinning, "memlock_limit", lambda: None)
    src = tiny_dir("qwen3_next")
    shape = read_model_shape(src)
    m = MachineMemory(16 * GiB, 16 * GiB, "test", 8 * GiB, 8 * GiB)
    cfg = EngineConfig(model=str(src), device="cuda", moe_backend="resident", state_cache_gib=0.5)
    _, plan = make_plan(cfg, shape, m)
    parts = plan_mod.snapshot_parts(shape, cfg)
    each = sum(parts)
    assert parts and any(p & (p - 1) for p in parts)          # not already powers of two
    block = sum(1 << (p - 1).bit_length() for p in parts)   # one pinned block a part
    snaps = int(0.5 * GiB) // each
    items = {i.name: i.nbytes for i in plan.items}
    assert items["state checkpoints"] == int(0.5 * GiB)
    assert items["checkpoint rounding"] == snaps * block - int(0.5 * GiB)
    assert plan.pinned == snaps * block                         # resident: no pool pinned
    _, cpu_plan = make_plan(EngineConfig(model=str(src), state_cache_gib=0.5), shape, m)
    assert "checkpoint rounding" not in {i.name for i in cpu_plan.items} and cpu_plan.pinned == 0


def test_checkpoints_shrink_to_whole_rounded_snapshots_when_host_is_short(tiny_dir, monkeypatch):
    from freetoken.experts.memory import pinning
    monkeypatch.setattr(pinning, "memlock_limit", lambda: None)
    src = tiny_dir("qwen3_next")
    shape = read_model_shape(src)
    cfg = EngineConfig(model=str(src), device="cuda", moe_backend="hybrid", expert_cache_slots=4)
    pool_bytes = next(i.nbytes for i in make_plan(cfg, shape, MachineMemory(64 * GiB, 64 * GiB, "t", 8 * GiB, 8 * GiB))[1].items
                      if i.name == "expert pool")
    m = MachineMemory(4 * GiB, 4 * GiB, "test", 8 * GiB, 8 * GiB)    # host budget 2 GiB < the 8 GiB default
    _, plan = make_plan(cfg, shape, m)
    assert plan.used("host") <= plan.available["host"]
    ckpt = next(i.nbytes for i in plan.items if i.name == "state checkpoints")
    each = sum(plan_mod.snapshot_parts(shape, cfg))
    assert 0 < ckpt and ckpt % each == 0
    assert pool_bytes + plan_mod.pinned_checkpoint_bytes(ckpt, shape, cfg) <= plan.available["host"]


@pytest.mark.parametrize("arch,kv,compute", [("qwen3_moe", "bfloat16", "auto"), ("qwen3_moe", "bfloat16", "float32"),
                                             ("deepseek_v3", "bfloat16", "auto"),
                                             ("deepseek_v32", "bfloat16", "auto")])
def test_cuda_plan_budgets_the_gathered_kv(tiny_dir, arch, kv, compute):
    """What attention.gather materialises for max_num_seqs sequences of max_model_len keys (the
    CUDA fallback when the paged kernel cannot run), with DSA's fp32 indexer keys, measured on
    real tensors, is what the plan's CUDA activations add over the CPU plan's."""
    import torch

    from freetoken.layers.attention.paged import AttentionMetadata, KVCache, gather, gather_rows
    src = tiny_dir(arch)
    shape = read_model_shape(src)
    seqs, max_len = 3, 64
    opts = dict(model=str(src), dtype=kv, compute_dtype=compute, max_num_seqs=seqs, max_model_len=max_len)
    m = MachineMemory(16 * GiB, 16 * GiB, "test", 8 * GiB, 8 * GiB)
    want = plan_mod.gathered_kv_bytes(shape, EngineConfig(**opts), max_len)
    cuda_act = plan_mod.activation_bytes(shape, EngineConfig(**opts, device="cuda"), 64, max_len, "cuda")
    cpu_act = plan_mod.activation_bytes(shape, EngineConfig(**opts), 64, max_len, "cpu")
    assert cuda_act - cpu_act == want > 0
    dt = {"bfloat16": torch.bfloat16, "float32": torch.float32}
    q_dtype = dt[kv] if compute == "auto" else dt[compute]
    meta = AttentionMetadata(slot_mapping=torch.zeros(seqs, dtype=torch.long),
                             key_slots=torch.arange(seqs * max_len).view(seqs, max_len),
                             key_positions=torch.arange(max_len).expand(seqs, max_len),
                             query_index=torch.arange(seqs).view(seqs, 1),
                             query_positions=torch.full((seqs, 1), max_len - 1), num_tokens=seqs)
    cfg = shape.config
    if cfg.get("kv_lora_rank"):                        # MLA: one latent row per key, no values
        latent, index = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], cfg.get("index_head_dim", 0)
        cache = KVCache(seqs * max_len, 1, latent + index, dt[kv], "cpu", values=False)
        rows = gather_rows(cache.k, meta)
        got = rows.nbytes + (rows[..., :latent].to(q_dtype).nbytes if q_dtype != dt[kv] else 0)
        got += rows[..., latent:].float().nbytes if index else 0    # DSA's indexer keys, fp32 (dsa.py)
    else:
        kvh = cfg["num_key_value_heads"]
        hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        cache = KVCache(seqs * max_len, kvh, hd, dt[kv], "cpu")
        k = torch.zeros(seqs, kvh, hd)
        q = torch.zeros(seqs, cfg["num_attention_heads"], hd, dtype=q_dtype)
        _, keys, values = gather(q, k, k, cache, meta)          # the rows, then their conversion
        rows = gather_rows(cache.k, meta).nbytes + gather_rows(cache.v, meta).nbytes
        got = rows + (keys.nbytes + values.nbytes if keys.dtype != cache.k.dtype else 0)
    assert got == want
