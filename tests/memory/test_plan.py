"""The memory plan: each component's arithmetic against what the engine really allocates,
the reduction order under any amount of free memory (hypothesis), and boot that never fails
for lack of memory while the weights fit."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken import LLM, SamplingParams
from freetoken.cli import main as cli_main
from freetoken.config import EngineConfig
from freetoken.memory import plan as plan_mod
from freetoken.memory import resolve as resolve_mod
from freetoken.memory.model_size import read_model_shape
from freetoken.memory.plan import expert_nbytes, expert_format, make_plan, state_bytes_per_seq
from freetoken.memory.probe import GiB, MachineMemory, cgroup_room, probe
from freetoken.loading.convert import convert

ORDER = ["expert cache", "state checkpoints", "KV cache", "prefill chunk", "max_model_len"]


def machine(free_gib: float, total_gib: float = 4.0, device_free_gib: float | None = None) -> MachineMemory:
    """A machine whose plan budget (host memory less the default 2 GiB headroom) is
    free_gib - 0.5 GiB, all of it free now (total_gib: kept for the callers' reading)."""
    dev = None if device_free_gib is None else int(device_free_gib * GiB)
    total = int((free_gib - 0.5 + 2) * GiB)
    return MachineMemory(total, total, "test", dev, dev)


@pytest.mark.parametrize("arch,fmt", [("qwen3_moe", None), ("qwen3_moe", "int8"), ("qwen3_moe", "mxfp4"),
                                      ("qwen3_moe", "fp8"), ("qwen2_moe", "bf16"), ("mixtral", None),
                                      ("olmoe", None), ("qwen3_next", None), ("qwen3_5_moe", "int8"),
                                      ("gpt_oss", None), ("gpt_oss_mxfp4", None), ("glm4_moe", "int8"),
                                      ("deepseek_v3", None), ("deepseek_v32", None), ("glm_moe_dsa", "mxfp4")])
def test_component_sizes_match_the_engine(tiny_dir, arch, fmt):
    src = tiny_dir(arch)
    llm = LLM(str(src), dtype="float32", expert_format=fmt, max_num_seqs=4)
    eng, plan = llm.engine, llm.engine.memory_plan
    items = {i.name: i for i in plan.items}
    assert items["expert pool"].nbytes == eng.model.pool.nbytes
    assert items["KV cache"].nbytes == eng.runner.kv_nbytes
    shape = read_model_shape(src)
    cfg = EngineConfig(model=str(src), dtype="float32", expert_format=fmt)
    per_expert = expert_nbytes(shape, expert_format(shape, cfg))
    assert per_expert == eng.model.pool.expert_nbytes
    state = eng.model.make_state()
    assert state_bytes_per_seq(shape, cfg) == (state.nbytes if state is not None else 0)


def test_dense_params_match_transformers(tiny_dir):
    from transformers import AutoModelForCausalLM
    src = tiny_dir("qwen2_moe")
    hf = AutoModelForCausalLM.from_pretrained(str(src))
    want = sum(p.numel() for n, p in hf.named_parameters() if ".experts." not in n)
    assert read_model_shape(src).dense_params == want


def test_ftw_shape_equals_directory_shape(tiny_dir, tmp_path):
    src = tiny_dir("qwen3_moe")
    convert(src, tmp_path / "m.ftw", expert_format="int8")
    cfg = EngineConfig(model=str(src), expert_format="int8")
    a, b = read_model_shape(src), read_model_shape(tmp_path / "m.ftw")
    assert a.dense_params == b.dense_params
    assert expert_nbytes(a, expert_format(a, cfg)) == expert_nbytes(b, "int8")


def _fits(plan, device):
    return plan.used(device) <= plan.available[device]


@settings(max_examples=60, deadline=None)
@given(free_mib=st.integers(520, 2048), kv_gib=st.one_of(st.none(), st.floats(0.001, 1e4)),
       max_len=st.one_of(st.none(), st.integers(64, 10**8)), chunk=st.integers(16, 8192),
       cache_gib=st.one_of(st.none(), st.floats(0.0, 1e3)), backend=st.sampled_from(["auto", "cpu", "offload", "hybrid"]))
def test_reductions_in_stated_order_and_fit(tiny_dir, free_mib, kv_gib, max_len, chunk, cache_gib, backend):
    src = tiny_dir("qwen3_moe")
    cfg = EngineConfig(model=str(src), dtype="float32", device="cpu", kv_cache_gib=kv_gib, max_model_len=max_len,
                       max_num_batched_tokens=chunk, expert_cache_gib=cache_gib, moe_backend=backend)
    m = machine(free_mib / 1024)
    resolved, plan = make_plan(cfg, read_model_shape(src), m)
    steps = [next(k for k, name in enumerate(ORDER) if w.startswith(name)) for w in plan.warnings]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)       # one line each, in order
    assert _fits(plan, "host")                                             # the weights fit: so does the plan
    assert resolved.max_model_len >= 2 * cfg.kv_block_size
    kv = next(i for i in plan.items if i.name == "KV cache")
    per_tok = plan_mod.kv_bytes_per_token(read_model_shape(src), cfg)
    assert kv.nbytes // per_tok >= resolved.max_model_len                  # one full-length sequence fits


def test_state_checkpoints_reduced_before_kv(tiny_dir):
    src = tiny_dir("qwen3_next")
    cfg = EngineConfig(model=str(src), dtype="float32", state_cache_gib=64.0, kv_cache_gib=64.0,
                       max_model_len=10**6)
    resolved, plan = make_plan(cfg, read_model_shape(src), machine(1.0, 4))
    assert plan.warnings[0].startswith("state checkpoints") and resolved.state_cache_bytes < 64 * 2**30
    assert [w.split(":")[0] for w in plan.warnings][:2] == ["state checkpoints", "KV cache"]
    assert _fits(plan, "host")


def test_cuda_plan_auto_resident_or_hybrid(tiny_dir):
    src = tiny_dir("qwen3_moe")
    shape = read_model_shape(src)
    cfg = EngineConfig(model=str(src), dtype="bfloat16", device="cuda")
    resolved, plan = make_plan(cfg, shape, machine(2, 8, device_free_gib=8))
    assert resolved.moe_backend == "resident" and not plan.warnings
    pool = next(i.nbytes for i in plan.items if i.name == "expert pool")
    kv_min = 4096 * plan_mod.kv_bytes_per_token(shape, cfg)
    room = 1 * GiB + kv_min + pool // 2                    # headroom + one sequence + half the pool
    resolved, plan = make_plan(EngineConfig(model=str(src), dtype="bfloat16", device="cuda", moe_backend="resident",
                                            max_num_batched_tokens=256),
                               shape, MachineMemory(8 * GiB, 2 * GiB, "test", room, room))
    assert resolved.moe_backend == "hybrid" and 0 < resolved.expert_cache_slots < 16
    assert plan.warnings[0].startswith("expert cache: the whole pool")
    assert _fits(plan, "cuda")


def test_weights_that_do_not_fit_warn_and_boot_plan(tiny_dir):
    src = tiny_dir("qwen3_moe")
    resolved, plan = make_plan(EngineConfig(model=str(src)), read_model_shape(src), machine(0.5, 4))
    lines = [w for w in plan.warnings if "non-expert weights" in w]
    assert len(lines) == 1 and "they need" in lines[0]            # one line saying what it would need
    assert resolved.max_model_len >= 32
    items = {i.name: i.nbytes for i in plan.items}
    between = (items["dense weights"] + items["expert pool"] // 2) / GiB + 0.5   # dense fits, the pool does not
    resolved, plan = make_plan(EngineConfig(model=str(src)), read_model_shape(src), machine(between, 4))
    # dense fits, the pool does not: the disk tier turns on (one line), nothing else is refused
    assert sum("read from the model file into a host cache" in w for w in plan.warnings) == 1
    assert resolved.expert_tier == "disk"
    assert not any("non-expert" in w for w in plan.warnings)


@pytest.mark.parametrize("opts", [dict(kv_cache_gib=1e6), dict(max_model_len=10**9),
                                  dict(moe_backend="offload", expert_cache_gib=1e6),
                                  dict(kv_cache_gib=1e6, max_model_len=10**9, expert_cache_gib=1e6,
                                       moe_backend="hybrid", max_num_batched_tokens=10**6)])
def test_boot_never_fails_for_lack_of_memory(tiny_dir, monkeypatch, opts):
    """Sizes far beyond the machine (here a fake 48 MiB of free memory after the reserve):
    the engine boots with reduced sizes and generates."""
    monkeypatch.setattr(resolve_mod, "probe", lambda *a: machine(0.5 + 48 / 1024, 4))
    llm = LLM(str(tiny_dir("qwen3_moe")), dtype="float32", **opts)
    assert llm.engine.memory_plan.warnings
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))[0]
    assert len(out.token_ids) == 4
    assert llm.engine.runner.kv_nbytes <= 48 << 20
    llm.close()


def test_probe_reads_this_machine():
    m = probe("cpu")
    assert 0 < m.host_available <= m.host_total
    room = cgroup_room()
    assert room is None or room[1] <= room[0]


def test_cgroup_limit_caps_available(tmp_path):
    (tmp_path / "memory.max").write_text(str(3 * GiB))
    (tmp_path / "memory.current").write_text(str(2 * GiB))
    assert cgroup_room(tmp_path) == (3 * GiB, 2 * GiB)
    (tmp_path / "memory.max").write_text("max")
    assert cgroup_room(tmp_path) is None


def test_plan_cli_prints_table_and_json(tiny_dir, capsys):
    src = str(tiny_dir("qwen3_moe"))
    assert cli_main(["plan", "--model", src, "--kv-cache-gib", "1000000", "--max-model-len", "1000000000"]) == 0
    out = capsys.readouterr().out
    assert "KV cache" in out and "warning: KV cache" in out and "resolved:" in out
    assert cli_main(["plan", "--model", src, "--json"]) == 0
    import json
    data = json.loads(capsys.readouterr().out)
    assert {"devices", "items", "warnings", "options"} <= set(data)


def test_cgroup_limit_of_the_process_own_cgroup_and_ancestors(tmp_path):
    """/proc/self/cgroup names the cgroup: v1 (memory controller) and v2 (0::), the tightest
    limit over it and its ancestors counts (a parent's limit binds its children)."""
    mount = tmp_path / "cg"
    leaf = mount / "memory" / "outer" / "inner"
    leaf.mkdir(parents=True)
    for d, limit, usage in ((mount / "memory", 2**63 - 4096, 5 * GiB), (mount / "memory" / "outer", 3 * GiB, 2 * GiB),
                            (leaf, 2**63 - 4096, 1 * GiB)):
        (d / "memory.limit_in_bytes").write_text(f"{limit}\n")
        (d / "memory.usage_in_bytes").write_text(f"{usage}\n")
    proc = tmp_path / "cgroup"
    proc.write_text("9:cpu,cpuacct:/x\n4:memory:/outer/inner\n0::/\n")
    assert cgroup_room(mount=mount, proc=proc) == (3 * GiB, 2 * GiB)
    v2 = mount / "sys.slice" / "job"
    v2.mkdir(parents=True)
    (v2 / "memory.max").write_text(f"{GiB}\n")
    (v2 / "memory.current").write_text(f"{GiB // 4}\n")
    proc.write_text("0::/sys.slice/job\n")
    assert cgroup_room(mount=mount, proc=proc) == (GiB, GiB // 4)
    proc.write_text("0::/\n")                       # unlimited everywhere
    assert cgroup_room(mount=mount, proc=proc) is None


@pytest.mark.skipif(not os.access("/sys/fs/cgroup/memory", os.W_OK), reason="no writable cgroup-v1 memory controller")
def test_probe_reads_a_real_cgroup_v1_limit():
    """A child process put into a cgroup-v1 memory cgroup of 700 MiB sees 700 MiB as the machine."""
    import subprocess
    import sys
    cg = Path("/sys/fs/cgroup/memory") / f"freetoken-test-probe-{os.getpid()}"
    cg.mkdir()
    try:
        (cg / "memory.limit_in_bytes").write_text(str(700 << 20))
        code = ("from freetoken.memory.probe import probe; m = probe('cpu'); "
                "print(m.host_total, m.total_source, m.host_available <= m.host_total)")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           preexec_fn=lambda: (cg / "tasks").write_text(str(os.getpid())))
        assert p.stdout.split() == [str(700 << 20), "cgroup", "limit", "True"]
    finally:
        cg.rmdir()


def _moe_plan(tiny_dir, total: int, source: str, **opts):
    from freetoken.config import EngineConfig
    from freetoken.memory.model_size import read_model_shape
    src = tiny_dir("qwen3_moe")
    cfg = EngineConfig(model=str(src), dtype="float32", max_model_len=64, **opts)
    return make_plan(cfg, read_model_shape(str(src)), MachineMemory(total, total, "test", total_source=source))


def test_host_cache_that_cannot_fit_under_the_limit_is_refused_or_shrunk(tiny_dir):
    from freetoken.experts.disk.plan import PROCESS_FLOOR, MemoryLimitError
    _, plan = _moe_plan(tiny_dir, 64 * GiB, "MemTotal", expert_tier="disk")
    pool = next(i.nbytes for i in plan.items if i.name == "expert pool")
    dense = next(i.nbytes for i in plan.items if i.name == "dense weights")
    limit = PROCESS_FLOOR + dense + pool // 4                     # a quarter of the pool fits beside the rest
    with pytest.raises(MemoryLimitError, match=r"host_cache_gib: .* cannot fit under the cgroup limit .* at most"):
        _moe_plan(tiny_dir, limit, "cgroup limit", host_cache_gib=pool / GiB * 0.9)
    _, plan = _moe_plan(tiny_dir, limit, "cgroup limit", expert_tier="disk")   # forced, no size: 50%, shrunk
    cache = next(i.nbytes for i in plan.items if i.name == "host expert cache")
    assert 0 < cache <= pool // 4 and any("shrunk" in w for w in plan.warnings)
    with pytest.raises(MemoryLimitError, match="expert_tier=ram: .* cannot fit under the cgroup limit"):
        _moe_plan(tiny_dir, limit, "cgroup limit", expert_tier="ram")
    s, _ = _moe_plan(tiny_dir, limit, "MemTotal", expert_tier="ram")          # not a hard limit: a warning
    assert s.expert_tier == "ram"


def test_forced_tier_default_size_keeps_the_headroom_under_a_limit(tiny_dir):
    """The disk tier forced without a size (half the pool) fits the cgroup limit but not the
    budget the headroom leaves: it shrinks to the budget, so the KV cache and context keep
    their room (a 10 GiB cgroup once left a 32-token context)."""
    from freetoken.experts.disk.plan import PROCESS_FLOOR
    _, plan = _moe_plan(tiny_dir, 64 * GiB, "MemTotal", expert_tier="disk")
    pool = next(i.nbytes for i in plan.items if i.name == "expert pool")
    dense = next(i.nbytes for i in plan.items if i.name == "dense weights")
    limit = PROCESS_FLOOR + dense + pool                              # half the pool fits under the limit
    headroom = 0.75 * pool / GiB                                      # ... a quarter of it in the budget
    s, plan = _moe_plan(tiny_dir, limit, "cgroup limit", expert_tier="disk", memory_headroom_gib=headroom)
    cache = next(i.nbytes for i in plan.items if i.name == "host expert cache")
    assert 0 < cache <= pool // 4 and any("shrunk" in w for w in plan.warnings)
    assert plan.used("host") <= plan.available["host"] and s.max_model_len == 64
