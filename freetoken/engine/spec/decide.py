"""Which draft to verify and how long: the rule the speculator and the model-free bound
(bench/spec_bounds.py) share.

The aim is the most tokens per second over the run, not per step. A k-token draft buys E_k
expected accepted tokens for dt_k more seconds of the step; those seconds were worth R tokens
each, R the speed speculation reaches overall. So k maximises E_k - R * dt_k (k = 0 scores 0):
Dinkelbach's rule for a ratio of sums, whose fixed point (R the speed its own choices give) is
the policy with the most tokens per second of all (tests/engine/test_spec_decide.py checks it
against every policy of small cases). Maximising each step's own tokens per second (the rule
before) drafted marginal steps: a draft that beats a plain step but not the run's speed slows
the run. R comes from acceptance.Speedup, in plain steps' units, times MARGIN."""
from __future__ import annotations

from .drafters import Draft

MARGIN = 1.02           # a draft must earn 2% more tokens per second than the run reaches


def best_length(expected: list[float], extra_seconds: list[float], per_second: float) -> tuple[int, float]:
    """(k, value): the k in 0..len-1 with the most expected[k] - per_second * extra_seconds[k];
    k = 0 (value 0) unless a draft scores more."""
    best_k, best_v = 0, 0.0
    for k in range(1, len(expected)):
        v = expected[k] - per_second * extra_seconds[k]
        if v > best_v:
            best_k, best_v = k, v
    return best_k, best_v


def likeliest(drafts: list[Draft], stats) -> Draft:
    """The proposal with the most expected accepted tokens at its full length."""
    return max(drafts, key=lambda d: stats.expected_accepted(d.drafter, d.bucket, len(d.tokens))[-1])


def choose(drafts: list[Draft], stats, extra, per_second: float) -> tuple[Draft | None, int]:
    """(draft, k) of the most value among the proposals (None, 0 when none pays); `extra(draft,
    k)`: the step's seconds more with the k tokens of `draft` than without."""
    best, best_k, best_v = None, 0, 0.0
    for d in drafts:
        exp = stats.expected_accepted(d.drafter, d.bucket, len(d.tokens))
        k, v = best_length(exp, [0.0] + [extra(d, j) for j in range(1, len(d.tokens) + 1)], per_second)
        if k and v > best_v:
            best, best_k, best_v = d, k, v
    return best, best_k
