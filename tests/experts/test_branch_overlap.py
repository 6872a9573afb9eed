"""The fill branch and the CPU branch of one layer-step run at the same time.

Both branches are made slow with sleeps (a paced link, a sleeping CPU executor), so the
check is about structure, not about this machine's speed: if the step's wall time is
below the sum of the two branch times, they overlapped."""
import time

import torch
from tiered_helpers import make_pool, one_torch_thread, reference  # noqa: F401

from freetoken.experts.execution.host_exec import TorchHostExecutor
from freetoken.experts.execution.tiered import TieredExperts
from freetoken.experts.memory.transfer import PacedCopyEngine

BRANCH_S = 0.25


class SleepyHost(TorchHostExecutor):
    def run(self, x, expert_ids, weights, out=None):
        time.sleep(BRANCH_S)
        return super().run(x, expert_ids, weights, out)


def test_fill_and_cpu_branches_overlap():
    pool = make_pool(layers=1, experts=4, hidden=16, inter=8)
    link = PacedCopyEngine(pool.expert_nbytes / BRANCH_S)          # one expert per BRANCH_S
    be = TieredExperts(pool, torch.device("cpu"), 4, "hybrid", host_executor=SleepyHost(pool), copy_engine=link)
    be.planner.fixed_q = 1                                          # 2 misses: one fills, one on the CPU
    x, ids, w = torch.randn(1, 16), torch.tensor([[1, 3]]), torch.tensor([[0.7, 0.3]])
    be.begin_step("decode")
    t0 = time.perf_counter()
    out = be.forward(0, x, ids, w)
    wall = time.perf_counter() - t0
    torch.testing.assert_close(out, reference(pool).forward(0, x, ids, w))
    tot = be.stats()["total"]
    assert tot["fills"] == 1 and tot["cpu_experts"] == 1
    assert tot["fill_s"] >= BRANCH_S * 0.9 and tot["cpu_s"] >= BRANCH_S * 0.9
    assert wall < 0.8 * (tot["fill_s"] + tot["cpu_s"]), (wall, tot["fill_s"], tot["cpu_s"])
    be.close()


def test_background_fill_does_not_stall_the_step():
    """A slow link with q* rounding to 0: the step runs its misses on the CPU and does not
    wait for the one warming fill."""
    from freetoken.experts.measure.bandwidth import BandwidthEstimator
    pool = make_pool(layers=1, experts=4, hidden=16, inter=8)
    link = PacedCopyEngine(pool.expert_nbytes / (4 * BRANCH_S))     # a fill takes 4x a CPU step
    be = TieredExperts(pool, torch.device("cpu"), 4, "hybrid", host_executor=SleepyHost(pool), copy_engine=link,
                       guard=False, estimator=BandwidthEstimator(1e6, 1e12, online=False))
    be.begin_step("decode")
    t0 = time.perf_counter()
    be.forward(0, torch.randn(1, 16), torch.tensor([[1, 3]]), torch.tensor([[0.5, 0.5]]))
    wall = time.perf_counter() - t0
    assert be.stats()["total"]["warm_fills"] == 1
    assert wall < 2 * BRANCH_S < 4 * BRANCH_S
    be.close()
