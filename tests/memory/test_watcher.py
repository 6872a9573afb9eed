"""The free-memory watcher, driven by a fake /proc/meminfo (and cgroup files) the test rewrites:
below the floor it gives back expert cache, then checkpoints, then KV; between floor and
ceiling it does nothing; above the ceiling it grows back to the start-up plan; actions are
rate-limited; and the engine serving through it keeps its output."""
from __future__ import annotations

import pytest

from freetoken import LLM, SamplingParams
from freetoken.memory.probe import GiB, probe
from freetoken.memory.watcher import MemoryWatcher, WatchPolicy

MiB = 1 << 20


class FakeMachine:
    """A meminfo file and a cgroup dir whose free memory the test sets."""

    def __init__(self, tmp_path):
        self.meminfo = tmp_path / "meminfo"
        self.cgroup = tmp_path / "cgroup"
        self.cgroup.mkdir()
        self.set(8 * GiB)

    def set(self, available: int, cgroup_room: int | None = None) -> None:
        self.meminfo.write_text(f"MemTotal:       {16 * GiB // 1024} kB\nMemFree:        1000 kB\n"
                                f"MemAvailable:   {available // 1024} kB\n")
        if cgroup_room is None:
            (self.cgroup / "memory.max").write_text("max\n")
            (self.cgroup / "memory.current").write_text("0\n")
        else:
            (self.cgroup / "memory.max").write_text(f"{16 * GiB}\n")
            (self.cgroup / "memory.current").write_text(f"{16 * GiB - cgroup_room}\n")

    def free(self) -> dict:
        return {"host": probe("cpu", meminfo=self.meminfo, cgroup=self.cgroup).host_available}


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def sizes(expert=400 * MiB, kv=300 * MiB, state_budget=200 * MiB, state_used=100 * MiB):
    return {"expert_cache": {"bytes": expert, "device": "cpu"}, "kv_cache": {"bytes": kv, "device": "cpu"},
            "state_cache": {"bytes": state_budget, "used_bytes": state_used, "device": "host"}}


def watcher(machine, clock, floor=1 * GiB, ceiling=2 * GiB):
    planned = {k: v["bytes"] for k, v in sizes().items()}
    return MemoryWatcher(WatchPolicy(floor, ceiling, min_interval_s=10), planned, machine.free, clock)


def test_below_the_floor_gives_back_experts_then_checkpoints_then_kv(tmp_path):
    m, clock = FakeMachine(tmp_path), Clock()
    w = watcher(m, clock, floor=1024 * MiB, ceiling=1200 * MiB)
    m.set(1100 * MiB)                                           # between floor and ceiling: nothing
    assert w.decide(sizes()) is None
    m.set(1000 * MiB)                                           # 200 MiB short of the ceiling
    assert w.decide(sizes()) == {"expert_cache_gib": 200 / 1024, "allow_preempt": False}
    m.set(8 * GiB, cgroup_room=600 * MiB)                       # the cgroup is tighter than MemAvailable
    clock.t = 5                                                 # within min_interval: nothing
    assert w.decide(sizes()) is None
    clock.t = 10
    # 600 short: 400 of experts, the 100 checkpoints use, 100 of KV
    assert w.decide(sizes()) == {"expert_cache_gib": 0.0, "state_cache_gib": 0.0,
                                 "kv_cache_gib": 200 / 1024, "allow_preempt": False}
    clock.t = 20
    m.set(100 * MiB)                                            # more than everything: all of it
    assert w.decide(sizes()) == {"expert_cache_gib": 0.0, "state_cache_gib": 0.0, "kv_cache_gib": 0.0,
                                 "allow_preempt": False}


def test_above_the_ceiling_grows_back_to_the_plan_kv_first(tmp_path):
    m, clock = FakeMachine(tmp_path), Clock()
    w = watcher(m, clock)
    m.set(2 * GiB + 350 * MiB)                                  # 350 MiB above the ceiling
    got = w.decide(sizes(expert=0, kv=100 * MiB, state_budget=0, state_used=0))
    assert got == {"kv_cache_gib": 300 / 1024, "state_cache_gib": 150 / 1024, "allow_preempt": False}
    clock.t = 20
    m.set(8 * GiB)
    assert w.decide(sizes()) is None                            # at the plan: never beyond it


def test_the_disk_tiers_host_cache_gives_back_after_the_expert_cache(tmp_path):
    m, clock = FakeMachine(tmp_path), Clock()
    with_hc = lambda hc, **kw: {**sizes(**kw), "host_cache": {"bytes": hc, "device": "host"}}   # noqa: E731
    planned = {k: v["bytes"] for k, v in with_hc(500 * MiB).items()}
    w = MemoryWatcher(WatchPolicy(1 * GiB, 1200 * MiB, min_interval_s=10), planned, m.free, clock)
    m.set(700 * MiB)                                            # 500 MiB short of the ceiling
    assert w.decide(with_hc(500 * MiB, expert=100 * MiB)) == {"expert_cache_gib": 0.0, "host_cache_gib": 100 / 1024,
                                                              "allow_preempt": False}
    clock.t = 20
    m.set(1900 * MiB)                                           # 700 above: KV, checkpoints, then the host cache
    got = w.decide(with_hc(100 * MiB, expert=0, kv=100 * MiB, state_budget=0, state_used=0))
    assert got == {"kv_cache_gib": 300 / 1024, "state_cache_gib": 200 / 1024, "host_cache_gib": 400 / 1024,
                   "allow_preempt": False}


def test_engine_serving_through_watcher_resizes_keeps_its_output(tmp_path, tiny_dir):
    model = str(tiny_dir("qwen3_moe", num_experts=8, num_experts_per_tok=2))
    opts = dict(dtype="float32", moe_backend="offload", expert_cache_slots=8, kv_block_size=8, max_model_len=256,
                max_num_seqs=4)
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    prompts = [[7 + i, 40, 41, 42, 43 + i] * (3 + i) for i in range(4)]
    ref = [o.token_ids for o in LLM(model, **opts).generate(prompts, params)]

    engine = LLM(model, **opts).engine
    m, clock = FakeMachine(tmp_path), Clock()
    planned = {c: s["bytes"] for c, s in engine.memory_sizes().items() if s is not None}
    w = MemoryWatcher(WatchPolicy(1 * GiB, 2 * GiB, min_interval_s=0), planned, m.free, clock)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    toks = {f"r{i}": [] for i in range(4)}
    step, actions = 0, []
    while engine.has_unfinished():
        m.set(512 * MiB if (step // 4) % 2 == 0 else 4 * GiB)   # another program comes and goes
        want = w.decide(engine.memory_sizes())
        if want:
            actions.append(engine.resize_memory(**want, trigger="watcher"))
        for o in engine.step():
            toks[o.request_id].extend(o.new_token_ids)
        step += 1
    assert [toks[f"r{i}"] for i in range(4)] == ref
    shrinks = [a for a in actions if a["components"].get("expert_cache", {}).get("slots_after") == 0]
    grows = [a for a in actions if a["components"].get("expert_cache", {}).get("slots_after") == 8]
    assert shrinks and grows
    assert engine.memory_sizes()["expert_cache"]["slots"] in (0, 8)
    engine.blocks.check([s.block_table for s in engine.scheduler.running])
    engine.prefix.check()
