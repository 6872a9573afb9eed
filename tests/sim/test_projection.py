"""Projection: the layer time model, the split rules, and the cache the engine keeps."""

import json
import math

import pytest

from freetoken.sim.access import stream_from_keys
from freetoken.sim.hardware import Hardware, HardwareError, load_hardware, parse_hardware, preset_names
from freetoken.sim.projection import best_fixed_fraction, project, q_balanced, q_star
from freetoken.sim.split_time import GB, layer_time, overlapped

HW = Hardware("t", link_gbps=10, cpu_gbps=40, link_concurrent_gbps=5, cpu_concurrent_gbps=20, device_gbps=1000)


def test_each_branch_alone_runs_at_its_solo_bandwidth():
    assert overlapped(10 * GB, 0, HW) == (1.0, 0.0)
    assert overlapped(0, 40 * GB, HW) == (0.0, 1.0)


def test_overlap_slows_both_then_the_survivor_speeds_up():
    # link: 5 GB at 5 GB/s -> done at 1 s; CPU moved 20 GB by then, 20 GB left at 40 GB/s
    link, cpu = overlapped(5 * GB, 40 * GB, HW)
    assert link == pytest.approx(1.0) and cpu == pytest.approx(1.5)


def test_layer_time_adds_device_work_and_dense_weights():
    b = 1 * GB
    assert layer_time(3, 0, 0, b, 0, HW) == pytest.approx(3 * b / (1000 * GB))
    assert layer_time(0, 1, 0, b, 0, HW) == pytest.approx(0.1 + 0.001)
    assert layer_time(0, 0, 1, b, 2 * GB, HW) == pytest.approx(0.025 + 0.002)


def test_q_star_rule_and_its_clamps():
    assert q_star(0, HW) == 0
    assert q_star(1, HW) == 1  # at least one fill while misses remain
    # B_P = 5 and B_H = 5 + 20 while both run (experts/measure/bandwidth.py): 8 * 5 / 25 = 1.6, and q = 1
    # gives the shorter slower branch (max(1/5, 7/20) < max(2/5, 6/20))
    assert q_star(8, HW) == 1
    fast_link = Hardware("f", 100, 10, 100, 10, 1000)
    assert q_star(4, fast_link) == 4
    assert q_balanced(8, HW) == 2 and q_balanced(0, HW) == 0 and q_balanced(1, HW) == 0


def stream():
    # 2 layers x 3 experts; prefill warms {0, 3}; decode cycles over all experts
    return stream_from_keys(2, 3, [("prefill", [[0], [3]]), ("decode", [[0, 1], [3, 4], [1, 2], [4, 5]] * 3)])


def test_all_cpu_never_fills_and_all_fill_never_uses_the_cpu():
    s = stream()
    cpu = project(s, 6, HW, 2, "all-cpu", [GB] * 2, [0, 0])
    fill = project(s, 6, HW, 2, "all-fill", [GB] * 2, [0, 0])
    assert cpu.fills == 0 and cpu.hits == 6  # only the prefill-warmed 0 and 3 ever hit
    assert fill.cpu == 0
    for p in (cpu, fill):
        assert p.hits + p.fills + p.cpu == s.decode_accesses()


def test_a_cache_holding_everything_only_hits():
    s = stream()
    for split in ("all-fill", "fixed", "q*"):  # rules that fill at least one miss per cell
        p = project(s, 6, HW, 6, split, [GB] * 2, [0, 0])
        assert p.hits == s.decode_accesses() - 4  # 1, 2, 4, 5 miss once each
    warm = stream_from_keys(1, 2, [("prefill", [[0, 1]]), ("decode", [[0, 1]] * 4)])
    p = project(warm, 4, HW, 2, "q*", [GB], [0])
    assert p.hits == 8 and p.tokens_per_second == pytest.approx(4 / (4 * 2 * GB / (1000 * GB)))


def test_fills_never_evict_the_cells_own_hits():
    s = stream_from_keys(1, 4, [("prefill", [[0]]), ("decode", [[0, 1, 2, 3]])])
    p = project(s, 1, HW, 2, "all-fill", [GB], [0])
    # as the engine: the hit stays locked, the three misses fill in waves through the one free slot
    assert (p.hits, p.fills, p.cpu) == (1, 3, 0)
    again = stream_from_keys(1, 4, [("prefill", [[0]]), ("decode", [[0, 1, 2, 3], [0]])])
    assert project(again, 2, HW, 2, "all-fill", [GB], [0]).hits == 2


def test_best_fixed_fraction_is_at_least_both_extremes():
    s = stream()
    f, best = best_fixed_fraction(s, 6, HW, 3, [GB] * 2, [0, 0])
    for split in ("all-fill", "all-cpu"):
        assert best.tokens_per_second >= project(s, 6, HW, 3, split, [GB] * 2, [0, 0]).tokens_per_second - 1e-9
    assert 0 <= f <= 1


def test_presets_load_and_have_sane_numbers():
    names = preset_names()
    assert {"rtx5090-desktop", "rtx4060-laptop", "rtx3090-server-6t", "rtx4090-server-6t", "rtx5090-server-6t"} <= set(names)
    for name in names:
        hw = load_hardware(name)
        assert 0 < hw.link_concurrent_gbps <= hw.link_gbps and 0 < hw.cpu_concurrent_gbps <= hw.cpu_gbps
    desk = load_hardware("rtx5090-desktop")
    assert (desk.link_gbps, desk.cpu_gbps) == (52.7, 53.8)


def test_freetoken_profile_file(tmp_path):
    p = tmp_path / "bandwidth.json"
    entry = {"b_p": 20e9, "b_h": 30e9, "b_p_shared": 15e9, "b_h_shared": 25e9, "device": "cuda:NVIDIA GeForce RTX 4090"}
    p.write_text(json.dumps({"version": 1, "profiles": {"box|cpu|bf16": {"b_p": 1e9, "b_h": 2e9, "device": "cpu"},
                                                         "box|cuda:NVIDIA GeForce RTX 4090|bf16": entry}}))
    hw = load_hardware(str(p))
    assert (hw.link_gbps, hw.cpu_gbps, hw.link_concurrent_gbps, hw.cpu_concurrent_gbps, hw.device_gbps) == (20, 30, 15, 25, 1008)
    assert load_hardware(str(p), device_gbps=500).device_gbps == 500


def test_cpu_only_profile_uses_host_bandwidth_for_the_cache_tier(tmp_path):
    p = tmp_path / "bandwidth.json"
    p.write_text(json.dumps({"version": 1, "profiles": {"box|cpu|bf16": {"b_p": 40e9, "b_h": 20e9, "device": "cpu"}}}))
    hw = load_hardware(str(p))
    assert (hw.link_gbps, hw.cpu_gbps, hw.device_gbps) == (40, 20, 20)
    # no shared measurement: the engine's model (link unchanged, CPU branch gets B_H - B_P, >= 10%)
    assert (hw.link_concurrent_gbps, hw.cpu_concurrent_gbps) == (40, 2)


def test_unknown_gpu_in_a_profile_asks_for_device_bandwidth(tmp_path):
    p = tmp_path / "bandwidth.json"
    p.write_text(json.dumps({"version": 1, "profiles": {"box|cuda:Mystery|bf16": {"b_p": 1e9, "b_h": 2e9, "device": "cuda:Mystery"}}}))
    with pytest.raises(HardwareError, match="device_gbps.*--device-gbps"):
        load_hardware(str(p))


def test_host_peak_scales_concurrent_rates():
    hw = parse_hardware({"link_gbps": 50, "cpu_gbps": 50, "device_gbps": 1000, "host_peak_gbps": 80}, "x", "x")
    assert math.isclose(hw.link_concurrent_gbps, 40) and math.isclose(hw.cpu_concurrent_gbps, 40)


@pytest.mark.parametrize(
    "data, field",
    [({"cpu_gbps": 1, "device_gbps": 1}, "link_gbps"), ({"link_gbps": 1, "cpu_gbps": -1, "device_gbps": 1}, "cpu_gbps"),
     ({"link_gbps": 1, "cpu_gbps": 1, "device_gbps": 1, "link_concurrent_gbps": 1}, "cpu_concurrent_gbps")],
)
def test_bad_hardware_names_the_field(data, field):
    with pytest.raises(HardwareError, match=field):
        parse_hardware(data, "mine.json", "mine")


@pytest.mark.parametrize("policy", ["lru", "lfu", "lrfu"])
def test_slot_table_never_evicts_locked_entries(policy):
    import numpy as np

    from freetoken.experts.memory.slots import SlotTable

    t = SlotTable(4, 4, 3, policy)
    for key in (0, 1, 2):
        t.record(np.array([key]))
        slot = t.candidates(1)
        t.assign(np.array([key]), slot), t.ready(slot), t.unlock(slot)
    for _ in range(5):  # make 0 and 1 the most valuable for every policy
        t.record(np.array([0, 1]))
        t.touch(t.slot_of[[0, 1]])
    held = t.slot_of[[2]]
    t.lock(held)  # 2 is this cell's hit: the victim must be 0 or 1
    victim = t.candidates(1)
    assert len(victim) == 1 and victim[0] != held[0]
    t.check()


def test_lrfu_engine_cache_projection_runs_and_counts_every_access():
    s = stream()
    p = project(s, 6, HW, 3, "q*", [GB] * 2, [0, 0], cache_policy="lrfu")
    assert p.hits + p.fills + p.cpu == s.decode_accesses()
