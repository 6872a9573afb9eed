"""One meaning of B_H: `sim project`, the profile file and the engine pick the same q*."""
import json

import numpy as np
import pytest
import torch

from freetoken.experts.measure.bandwidth import BandwidthEstimator, load_profile
from freetoken.experts.memory.planner import MissPlanner
from freetoken.sim.access import stream_from_keys
from freetoken.sim.hardware import load_hardware
from freetoken.sim.projection import planner_rates, project, q_star
from freetoken.sim.split_time import GB, overlapped

ENTRIES = [
    {"b_p": 20e9, "b_h": 30e9, "b_p_shared": 15e9, "b_h_shared": 25e9},   # measured contention
    {"b_p": 12e9, "b_h": 40e9},                                            # no shared figures: modelled
    {"b_p": 3e9, "b_h": 60e9, "b_h_shared": 55e9},                         # slow link, one shared figure
    {"b_p": 50e9, "b_h": 20e9},                                            # link faster than the CPU
]


def write_profile(tmp_path, entry):
    key = "box|cuda:NVIDIA GeForce RTX 4090|bf16"
    p = tmp_path / "bandwidth.json"
    p.write_text(json.dumps({"version": 1, "profiles": {
        key: {**entry, "machine": "box", "device": "cuda:NVIDIA GeForce RTX 4090", "fmt": "bf16"}}}))
    return p


@pytest.mark.parametrize("entry", ENTRIES)
def test_engine_and_sim_pick_the_same_q_for_one_profile(tmp_path, entry):
    path = write_profile(tmp_path, entry)
    est = BandwidthEstimator.from_profile(load_profile(path, "box", "cuda:NVIDIA GeForce RTX 4090", "bf16"), "cuda")
    hw = load_hardware(str(path))
    sim_b_p, sim_b_h = planner_rates(hw)
    assert sim_b_p * 1e9 == pytest.approx(est.b_p) and sim_b_h * 1e9 == pytest.approx(est.b_h)
    engine, sim = MissPlanner(64, "hybrid", explore_every=0), MissPlanner(64, "hybrid", explore_every=0)
    for m in range(1, 65):
        misses, tokens = np.arange(m), np.ones(m, np.int64)
        a = engine.plan(misses, tokens, est.b_p, est.b_h)
        b = sim.plan(misses, tokens, sim_b_p, sim_b_h)
        assert (a.q, len(a.fill), len(a.warm)) == (b.q, len(b.fill), len(b.warm)), m
        assert q_star(m, hw) == a.q


@pytest.mark.parametrize("entry", ENTRIES[:3])
def test_q_star_balances_the_sims_own_branch_times(tmp_path, entry):
    """Independent of the formula: q*'s slower branch (the projection's own overlap model,
    where the survivor speeds up to its solo rate) is within one expert's time of the best q."""
    hw = load_hardware(str(write_profile(tmp_path, entry)))
    one_expert = 1.0 / min(hw.link_concurrent_gbps, hw.cpu_concurrent_gbps)
    for m in range(2, 40):
        slower = [max(overlapped(q * GB, (m - q) * GB, hw)) for q in range(m + 1)]
        assert slower[q_star(m, hw)] <= min(slower) + one_expert, m


def test_sim_project_q_star_uses_the_profile_rates(tmp_path):
    # one decode cell of 6 misses into an empty cache: `sim project` fills what the engine's q* says
    path = write_profile(tmp_path, ENTRIES[1])
    hw = load_hardware(str(path))
    est = BandwidthEstimator.from_profile(load_profile(path, "box", "cuda:NVIDIA GeForce RTX 4090", "bf16"),
                                          torch.device("cuda"))
    stream = stream_from_keys(1, 6, [("decode", [[0, 1, 2, 3, 4, 5]])])
    p = project(stream, 1, hw, 64, "q*", [GB], [0])
    want = MissPlanner(6, "hybrid").plan(np.arange(6), np.ones(6, np.int64), est.b_p, est.b_h)
    assert (p.fills, p.cpu) == (len(want.fill), len(want.cpu)) == (2, 4)
