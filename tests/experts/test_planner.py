"""The miss planner: the q* rule, its clamps, which misses fill, background fills."""
import numpy as np
import pytest

from freetoken.experts.memory.planner import MissPlanner, balanced_q, q_star


@pytest.mark.parametrize("m,b_p,b_h,want", [
    (0, 10, 20, 0),          # no misses, nothing to fill
    (8, 10, 20, 4),          # m * 1/2
    (8, 10, 40, 2),
    (8, 5, 16, 3),           # 2.5 rounds half up
    (7, 10, 30, 2),          # 2.33 -> 2
    (8, 1, 100, 1),          # 0.08 rounds to 0, clamped up to 1: keep warming
    (8, 30, 20, 8),          # link faster than the host: everything fills
    (8, 20, 20, 8),          # B_H == B_P: degenerates to plain on-demand filling
    (1, 1, 1000, 1),
    (3, 10, 0, 3),
])
def test_q_star(m, b_p, b_h, want):
    assert q_star(m, b_p, b_h) == want


def test_q_star_is_monotone_and_clamped():
    for m in range(1, 40):
        qs = [q_star(m, b_p, 100.0) for b_p in np.linspace(0.01, 150, 60)]
        assert all(1 <= q <= m for q in qs)
        assert qs == sorted(qs)


def plan(p, misses, tokens=None, b_p=10.0, b_h=20.0, **kw):
    misses = np.asarray(misses, np.int64)
    tokens = np.ones(len(misses), np.int64) if tokens is None else np.asarray(tokens)
    return p.plan(misses, tokens, b_p, b_h, **kw)


def test_policies_partition_the_misses():
    for policy in ("offload", "hybrid", "cpu"):
        p = MissPlanner(100, policy, explore_every=0)
        r = plan(p, [3, 9, 12, 40, 41])
        got = sorted(np.concatenate([r.fill, r.warm, r.cpu]).tolist())
        assert got == [3, 9, 12, 40, 41]
        assert len(r.fill) == {"offload": 5, "hybrid": balanced_q(5, 10, 20), "cpu": 0}[policy]


def test_fill_rule_tokens_then_demand_then_id():
    p = MissPlanner(100, "hybrid", explore_every=0)
    p.record(np.array([50, 50, 60]))              # demand: 50 twice, 60 once
    r = plan(p, [10, 50, 60, 70], tokens=[1, 1, 1, 3], b_p=10, b_h=20)   # q* = 2
    assert r.fill.tolist() == [70, 50]            # most tokens, then most demanded
    assert r.cpu.tolist() == [60, 10]


def test_demand_ages():
    p = MissPlanner(10, "hybrid", demand_halflife_steps=2)
    p.record(np.array([1]))
    p.end_step()
    p.end_step()
    assert p.demand[1] == 0.5


def test_slow_link_fill_goes_to_the_background():
    p = MissPlanner(100, "hybrid", explore_every=0)
    r = plan(p, [1, 2, 3, 4], b_p=1, b_h=100)
    assert r.q == 1 and len(r.fill) == 0 and r.warm.tolist() == [1] and r.cpu.tolist() == [2, 3, 4]
    r = plan(p, [1, 2, 3, 4], b_p=1, b_h=100, link_busy=True)   # never queue behind a busy link
    assert len(r.fill) == 0 and len(r.warm) == 0 and len(r.cpu) == 4


def test_exploration_keeps_the_cpu_estimate_alive():
    p = MissPlanner(100, "hybrid", explore_every=4)
    sizes = [len(plan(p, [1, 2, 3], b_p=30, b_h=20).cpu) for _ in range(8)]
    assert sizes == [0, 0, 0, 1, 0, 0, 0, 1]


def test_fixed_q_for_sweeps():
    p = MissPlanner(100, "hybrid")
    p.fixed_q = 2
    r = plan(p, [5, 6, 7])
    assert len(r.fill) == 2 and len(r.cpu) == 1


def test_unknown_policy():
    with pytest.raises(ValueError):
        MissPlanner(10, "lru")


def test_split_guard_probes_then_keeps_the_faster():
    from freetoken.experts.memory.planner import SplitGuard
    g = SplitGuard(probe=2, period=8)
    modes = []
    for step in range(16):
        m = g.next_step()
        modes.append(m)
        g.record(1.0 if m == "fill" else 2.0)          # plain filling is clearly faster here
    assert modes[:8] == ["qstar"] * 4 + ["fill", "fill", "qstar", "qstar"]
    assert modes[8:12] == ["fill"] * 4 and g.winner == "fill" and g.switches == 1
    g2 = SplitGuard(probe=2, period=8, margin=0.1)
    for step in range(8):
        m = g2.next_step()
        g2.record(1.95 if m == "fill" else 2.0)        # within the margin: the model keeps deciding
    assert g2.winner == "qstar" and g2.fill_steps == 2


def test_split_guard_survives_missing_samples():
    from freetoken.experts.memory.planner import SplitGuard
    g = SplitGuard(probe=2, period=8)
    for _ in range(8):
        g.next_step()                                    # no MoE time recorded at all
    assert g.winner == "qstar"


def test_balanced_rounding_picks_the_neighbour_with_the_shorter_slower_branch():
    from freetoken.experts.memory.planner import balanced_q
    assert balanced_q(8, 5, 16) == 2          # x = 2.5: q=2 -> max(0.4, 0.545), q=3 -> max(0.6, 0.455)
    assert balanced_q(5, 2, 18) == 0          # x = 0.56 rounds to 1, but one fill (0.5) > 5 on the CPU (0.31)
    assert balanced_q(7, 10, 30) == q_star(7, 10, 30) == 2
    for m in range(1, 12):
        for b_p in (0.5, 2, 8, 15, 19):
            q = balanced_q(m, b_p, 20.0)
            assert abs(q - m * b_p / 20.0) < 1 and 0 <= q <= m


def test_slow_link_background_follows_the_balance():
    p = MissPlanner(100, "hybrid", explore_every=0)
    r = plan(p, [1, 2, 3, 4, 5], b_p=2, b_h=18)   # round() would wait for a fill; the balance says 0
    assert len(r.fill) == 0 and len(r.warm) == 1 and r.q == 1
