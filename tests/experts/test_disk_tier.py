"""The disk tier gives the fully resident pool's numbers bit for bit: prompt logits and greedy
tokens, with a host cache holding the whole pool, 10% of it, and one slot per MoE layer, for
every architecture family over FTW (every expert format), safetensors and GGUF (ggml types)."""
from __future__ import annotations

import os

import pytest
import torch

from freetoken import LLM, SamplingParams, kernels
from freetoken.errors import CheckpointError
from freetoken.experts.disk.c_hits import HitCalls
from freetoken.loading.convert import convert


PROMPT = [5, 17, 3, 99, 42, 7, 250, 11, 64, 8, 300]
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def _outputs(llm: LLM):
    return llm.score(PROMPT), llm.generate([PROMPT, PROMPT[:5]], GREEDY)


def _sizes(llm: LLM) -> list[int]:
    pool = llm.engine.model.pool
    n = pool.num_layers * pool.num_experts
    return [n, max(1, n // 10), pool.num_layers]      # all, 10%, one slot per layer


def assert_disk_tier_matches(path, **opts):
    ref = LLM(str(path), **opts)
    logits, gens = _outputs(ref)
    sizes = _sizes(ref)
    ref.close()
    for slots in sizes:
        got = LLM(str(path), host_cache_slots=slots, **opts)
        assert got.engine.settings.expert_tier == "disk"
        g_logits, g_gens = _outputs(got)
        assert torch.equal(g_logits, logits), f"{slots} slots: prompt logits differ"
        assert [c.token_ids for c in g_gens] == [c.token_ids for c in gens], f"{slots} slots: tokens differ"
        st = got.expert_stats()
        assert st["disk"]["bytes_read"] > 0 and st["host_cache"]["slots"] == slots
        got.close()


FTW_CASES = [
    ("qwen3_moe", None, "float32"), ("qwen3_moe", "bf16", "bfloat16"), ("qwen3_moe", "int8", "float32"),
    ("qwen3_moe", "mxfp4", "float32"), ("mixtral", "int8", "float32"), ("deepseek_v3", None, "float32"),
    ("gpt_oss", None, "float32"), ("gpt_oss_mxfp4", None, "float32"), ("qwen3_5_moe", "int8", "float32"),
    ("qwen3_5_moe", None, "bfloat16"),
]


@pytest.mark.parametrize("arch,fmt,dtype", FTW_CASES, ids=[f"{a}-{f or 'native'}-{d}" for a, f, d in FTW_CASES])
def test_ftw_disk_tier_identical(tiny_dir, tmp_path, arch, fmt, dtype):
    out = tmp_path / "m.ftw"
    convert(tiny_dir(arch), out, expert_format=fmt, dtype=dtype)
    assert_disk_tier_matches(out, dtype=dtype)


ST_CASES = [("qwen3_moe", "float32"), ("qwen3_moe", "bfloat16"), ("mixtral", "float32"),
            ("deepseek_v3", "float32"), ("qwen3_5_moe", "float32")]


@pytest.mark.parametrize("arch,dtype", ST_CASES, ids=[f"{a}-{d}" for a, d in ST_CASES])
def test_safetensors_disk_tier_identical(tiny_dir, arch, dtype):
    assert_disk_tier_matches(tiny_dir(arch), dtype=dtype)


def test_safetensors_without_a_layout_says_convert(tiny_dir):
    with pytest.raises(CheckpointError, match="convert to FTW"):
        LLM(str(tiny_dir("qwen3_moe")), dtype="float32", expert_tier="disk", expert_format="int8")


def _cut_last_bank(ftw, keep_fraction=0.5):
    """Shrink the file inside its last expert bank (banks follow the dense tensors); returns the
    original bytes so the test can put them back."""
    from freetoken.weights.ftw.reader import read_header
    last = max((t for t in read_header(ftw)["tensors"] if t["kind"] == "bank"), key=lambda t: t["offset"])
    data = ftw.read_bytes()
    os.truncate(ftw, last["offset"] + int(last["nbytes"] * keep_fraction))
    return data


def test_file_shrunk_while_serving_fails_those_requests_engine_stays_up(tiny_dir, tmp_path):
    out = tmp_path / "m.ftw"
    convert(tiny_dir("qwen3_moe"), out, dtype="float32")
    ref = LLM(str(out), dtype="float32")
    want = ref.generate([PROMPT], GREEDY)[0].token_ids
    ref.close()
    llm = LLM(str(out), dtype="float32", host_cache_slots=2, prefix_cache=False)
    assert llm.generate([PROMPT], GREEDY)[0].token_ids == want
    data = _cut_last_bank(out)
    with pytest.raises(RuntimeError, match=r"truncated: expert \d+ of MoE layer \d+ \(bank 'down'\)"):
        llm.generate([PROMPT], GREEDY)
    assert llm.expert_stats()["disk"]["errors"] >= 1
    out.write_bytes(data)                            # the file is back: the same engine serves again
    assert llm.generate([PROMPT], GREEDY)[0].token_ids == want
    llm.close()


def test_plan_turns_the_disk_tier_on_when_the_pool_does_not_fit(tiny_dir):
    from freetoken.config import EngineConfig
    from freetoken.memory.model_size import read_model_shape
    from freetoken.memory.plan import make_plan
    from freetoken.memory.probe import MachineMemory
    src = tiny_dir("qwen3_moe")
    s = read_model_shape(str(src))
    cfg = EngineConfig(model=str(src), dtype="float32", max_model_len=64, kv_cache_gib=0.001, memory_headroom_gib=0.0)
    big = MachineMemory(host_total=2**36, host_available=2**35, host_source="test")
    same, plan = make_plan(cfg, s, big)
    assert same.expert_tier == "ram" and not any("host expert cache" == i.name for i in plan.items)
    pool = next(i.nbytes for i in plan.items if i.name == "expert pool")
    dense = next(i.nbytes for i in plan.items if i.name == "dense weights")
    small = MachineMemory(host_total=dense + pool // 2, host_available=dense + pool // 2, host_source="test")
    disk, plan = make_plan(cfg, s, small)
    assert disk.expert_tier == "disk" and 1 <= disk.host_cache_slots < 16
    assert [i.device for i in plan.items if i.name == "expert pool"] == ["disk"]
    assert sum("read from the model file into a host cache" in w for w in plan.warnings) == 1
    llm = LLM(str(src), dtype="float32", expert_tier="disk", host_cache_slots=disk.host_cache_slots)
    assert llm.expert_stats()["host_cache"]["slots"] == disk.host_cache_slots
    llm.close()


def test_prefetch_budget_from_b_d():
    from freetoken.experts.measure.diskbw import prefetch_budget
    assert prefetch_budget(1e9, 1e-3, 100_000) == 10          # 1 MB in the gap: 10 experts of 100 kB
    assert prefetch_budget(1.0, 1e-3, 100_000) == 1           # at least one
    assert prefetch_budget(None, 1e-3, 100_000) is None and prefetch_budget(1e9, None, 100_000) is None


def test_profiled_b_d_bounds_the_prefetch_tokens_unchanged(tiny_dir, tmp_path):
    """A profile's B_D reaches the disk tier (stats, /v1/memory): a disk too slow for any
    predicted expert in the gap between layers cuts the prefetch to one; tokens stay the
    resident run's."""
    import json

    from freetoken.experts.measure.bandwidth import BandwidthProfile, machine_id, save_profile
    out = tmp_path / "m.ftw"
    convert(tiny_dir("qwen3_moe"), out, dtype="float32")
    ref = LLM(str(out), dtype="float32")
    want = ref.generate([PROMPT], GREEDY)[0].token_ids
    ref.close()
    prof = tmp_path / "bw.json"
    save_profile(prof, BandwidthProfile(b_p=1e9, b_h=2e9, b_d=1e3, disk_queue_depth=3, machine=machine_id(),
                                        device="cpu", fmt="any"))
    llm = LLM(str(out), dtype="float32", host_cache_slots=8, prefix_cache=False, bandwidth_profile=str(prof))
    assert llm.engine.model.experts.b_d == 1e3
    assert llm.engine.model.experts.cache._io.threads == 3        # the profile's best queue depth
    for _ in range(3):                   # the predictor learns from the first tokens
        assert llm.generate([PROMPT], GREEDY)[0].token_ids == want
    disk = llm.expert_stats()["disk"]
    assert disk["b_d_gbs"] == 1e-6 and disk["layer_gap_s"] > 0 and disk["prefetch_cut"] > 0, json.dumps(disk)
    llm.close()


# (overlap, policy, the hit path's C build: c_hits.py; None: numpy), each build once on the default
ORDER_CASES = [(True, None, "native"), (False, None, "native"), (True, "lru", "native"), (True, "lfu+layer", "native"),
               (True, "arc", "native"), (True, "lrfu+prefetch", "native"),
               *((True, None, b) for b in (None, *kernels.variants_here()) if b != "native")]


@pytest.mark.parametrize("overlap,policy,hits", ORDER_CASES,
                         ids=[f"overlap-{o}-{p or 'default'}-hits-{h or 'numpy'}" for o, p, h in ORDER_CASES])
def test_outputs_identical_whatever_order_the_reads_land(tiny_dir, tmp_path, overlap, policy, hits):
    """A layer call computes the experts already in RAM while its misses are still read
    (experts/disk/backend.py: overlap on, `_run_as_landed`, any landed expert as it lands;
    off, `_landed_runs`, the landed prefix in id order): with each expert's read delayed by a
    drawn amount, so reads finish in arbitrary orders, logits and tokens stay the resident
    run's bit for bit under each cache policy and each way of the hit path's lookups (numpy,
    each C build), and calls really were cut where a read was in flight."""
    import time

    from hypothesis import given, settings
    from hypothesis import strategies as st
    out = tmp_path / "m.ftw"
    convert(tiny_dir("qwen3_moe"), out, expert_format="int8", dtype="float32")
    ref = LLM(str(out), dtype="float32")
    logits, gens = _outputs(ref)
    ref.close()
    llm = LLM(str(out), dtype="float32", host_cache_slots=6, prefix_cache=False,
              **({"expert_cache_policy": policy} if policy else {}))
    experts = llm.engine.model.experts
    experts.overlap = overlap
    experts.cache.hits_c = HitCalls.of(hits)
    reader = experts.cache.reader
    read = reader.read

    @settings(max_examples=10, deadline=None)
    @given(delays=st.lists(st.sampled_from([0.0, 0.0005, 0.002, 0.004]), min_size=16, max_size=16))
    def check(delays):
        reader.read = lambda flat, *a: (time.sleep(delays[flat % 16]), read(flat, *a))[1]
        g_logits, g_gens = _outputs(llm)
        assert torch.equal(g_logits, logits)
        assert [c.token_ids for c in g_gens] == [c.token_ids for c in gens]

    try:
        check()
        disk = llm.expert_stats()["disk"]
        assert disk["overlapped_runs"] > 0 and (disk["apart_rounds"] > 0) == overlap
    finally:
        reader.read = read
        llm.close()
