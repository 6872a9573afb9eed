"""Bandwidth profiles (file round trip, keys) and the online estimator driving q*."""
import json

import torch

from freetoken.experts.measure.bandwidth import BandwidthEstimator, BandwidthProfile, load_profile, save_profile
from freetoken.experts.memory.planner import q_star


def test_profile_round_trip_and_keys(tmp_path):
    path = tmp_path / "bw.json"
    a = BandwidthProfile(b_p=12e9, b_h=40e9, b_h_shared=25e9, machine="m1", device="cuda:X", fmt="float:bfloat16:64x32")
    b = BandwidthProfile(b_p=3e9, b_h=20e9, machine="m2", device="cpu", fmt="mxfp4:uint8:64x32")
    save_profile(path, a)
    save_profile(path, b)
    assert set(json.loads(path.read_text())["profiles"]) == {a.key, b.key}
    got = load_profile(path, "m1", "cuda:X", "float:bfloat16:64x32")
    assert got.b_p == 12e9 and got.b_h_shared == 25e9
    assert load_profile(path, "m1", "cuda:X", "mxfp4:uint8:64x32").b_p == 12e9   # same machine, other format
    assert load_profile(path, "m3", "cpu", "x") is None
    assert load_profile(tmp_path / "missing.json", "m1", "cuda:X", "") is None


def test_estimator_from_profile():
    prof = BandwidthProfile(b_p=10e9, b_h=30e9)
    est = BandwidthEstimator.from_profile(prof, torch.device("cpu"))
    assert abs(est.b_p - 10e9) < 1 and abs(est.b_h - 30e9) < 1      # CPU branch gets B_H - B_P
    assert q_star(6, est.b_p, est.b_h) == 2


def test_online_estimates_track_contention_and_move_q():
    est = BandwidthEstimator(b_p=10e9, b_h=20e9, alpha=0.3)
    assert q_star(8, est.b_p, est.b_h) == 4
    for _ in range(30):                    # the link slows to 2 GB/s (another program copies)
        est.observe_fill(8 << 20, (8 << 20) / 2e9)
    assert abs(est.b_p - 2e9) / 2e9 < 0.05
    assert q_star(8, est.b_p, est.b_h) == 1
    for _ in range(30):                    # the CPU branch slows to 1 GB/s (memory contention)
        est.observe_cpu(8 << 20, (8 << 20) / 1e9)
    assert q_star(8, est.b_p, est.b_h) == 5


def test_estimator_ignores_noise_and_can_be_frozen():
    est = BandwidthEstimator(b_p=10e9, b_h=20e9)
    est.observe_fill(100, 1e-7)             # below timer resolution
    est.observe_cpu(0, 1.0)
    assert est.samples == {"fill": 0, "cpu": 0}
    frozen = BandwidthEstimator(b_p=10e9, b_h=20e9, online=False)
    frozen.observe_fill(1 << 20, 1.0)
    assert frozen.b_p == 10e9
