"""Prompt-weighted frequency ('+prompt', lrfu only): what a prefill layer call adds to each
expert's LRFU count.

Without it a prefill call counts as one access of each expert any prompt token routed, so an
expert one early prompt token routed weighs as much as one every token routed, and as much as a
decode access. With it the call still counts as one pass (one token of the LRFU clock), but
each expert gets the recency-weighted share of the prompt tokens that routed it:

    share[e] = sum_{i: e in row i} w_i / sum_i w_i,    w_i = 2^-((T-1-i) / half_life)

(rows in prompt order, T of them; the half-life is the table's own, so the prompt's tokens decay
as decode tokens do). Each share is in (0, 1]: an expert every prompt token routed counts as a
decode access, one only the distant start of the prompt routed counts next to nothing, so the
first decode misses evict the prompt's stale experts first. Measured on the shared routing
traces: docs/benchmarks.md "Prompt-weighted frequency".
"""
from __future__ import annotations

import numpy as np


def prompt_shares(rows: np.ndarray, num_experts: int, half_life: float) -> np.ndarray:
    """[num_experts] float64: each expert's recency-weighted share of the rows (prompt tokens,
    oldest first; each row the expert ids one token routed) that routed it; 0 if none did."""
    rows = np.asarray(rows, np.int64)
    if rows.ndim != 2 or len(rows) == 0:
        return np.zeros(num_experts)
    T = len(rows)
    w = np.exp2(-(T - 1 - np.arange(T)) / half_life)
    routed = np.zeros((T, num_experts), bool)       # a row naming an expert twice counts it once
    routed[np.repeat(np.arange(T), rows.shape[1]), rows.ravel()] = True
    return (w @ routed) / w.sum()
