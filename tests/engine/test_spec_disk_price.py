"""Where a miss reads from the disk, a verify's extra experts are priced at the reads they wait
on (spec/price.py `miss_prior`): the price predicts steps whose seconds are compute plus demand
reads, a backend that reports expensive misses makes auto decline low-confidence drafts, and
greedy output stays plain's either way."""
from __future__ import annotations

import numpy as np
import pytest

from freetoken import LLM
from freetoken.engine.spec.price import VerifyPrice
import freetoken.experts.disk.backend as disk_backend

from test_speculative import GREEDY, ForcedDrafter, generate, ids_for

L, K = 4, 8                      # MoE layers, top-k: one position routes 32 experts


def _unions(n: int) -> int:
    return int(L * min(64, K * (1 + 0.6 * (n - 1))))


def test_price_adds_the_reads_of_experts_beyond_one_position():
    """Steps of compute a + b*n + c*experts plus reads: a plain step's few (read ahead), each
    expert beyond one position's a demand read of `read` s. Fitted on plain steps and a verify
    every fifth step (the read-time prior a third too dear), the price predicts both within 5%."""
    a, b, c, read, blocked1 = 0.050, 0.002, 0.0002, 0.0015, 0.004
    truth = {n: a + b * n + c * _unions(n) + blocked1 + read * (_unions(n) - L * K) for n in (1, 2, 3, 5, 9)}
    priced = VerifyPrice(L, K, 64, 3 << 20, expert_rate=20e9, miss_s=0.002)
    rng = np.random.default_rng(0)
    for i in range(200):
        n = (2, 3, 5, 9)[i // 5 % 4] if i % 5 == 4 else 1
        u = _unions(n)
        blocked = blocked1 + read * (u - L * K)
        t = (a + b * n + c * u) * (1 + 0.01 * rng.standard_normal()) + blocked
        priced.observe(n, u, t, blocked=blocked)
    for n, t in truth.items():
        assert priced.seconds(n, _unions(n)) == pytest.approx(t, rel=0.05), n


def test_read_price_starts_at_the_backends_read_time():
    """Before any verify, an expert beyond one position's costs the backend's read time (the
    line alone, fitted on plain steps, knows only the prior's CPU rate: on the 48-layer disk tier
    it priced verifies at 0.3-0.8 of their cost); a backend that reads nothing on a miss
    (miss_s None) adds nothing to the line."""
    p = VerifyPrice(L, K, 64, 3 << 20, expert_rate=20e9, miss_s=0.002)
    q = VerifyPrice(L, K, 64, 3 << 20, expert_rate=20e9)
    for _ in range(8):
        p.observe(1, L * K, 0.05, blocked=0.0)
        q.observe(1, L * K, 0.05)
    extra = _unions(3) - L * K
    assert p.seconds(3, _unions(3)) - q.seconds(3, _unions(3)) == pytest.approx(0.002 * extra, rel=1e-6)


def _drafted(tiny_dir, monkeypatch, read_rate):
    """Plain and auto output of a tiny disk-tier MoE whose drafter proposes the right tokens at
    the prior's confidence (bucket 0), the price on; a demand read priced at `read_rate` B/s."""
    monkeypatch.setattr(disk_backend, "MISS_READ_RATE", read_rate)
    path = tiny_dir("qwen3_moe")
    prompts = [ids_for(20, 70 + s) for s in range(2)]
    opts = dict(dtype="float32", expert_tier="disk", host_cache_slots=6, spec_probe=False)
    ref = generate(LLM(str(path), speculative="off", **opts), prompts, GREEDY)
    llm = LLM(str(path), **opts)
    spec = llm.engine.spec
    spec.drafters = {"forced": ForcedDrafter(prompts, ref, "right")}
    got = generate(llm, prompts, GREEDY)
    return ref, got, spec


def test_expensive_misses_decline_low_confidence_drafts(tiny_dir, monkeypatch):
    """A disk tier whose demand reads take 0.1 s an expert: drafts at the prior's confidence are
    never verified (k = 0), output is plain's."""
    ref, got, spec = _drafted(tiny_dir, monkeypatch, read_rate=1e3)
    assert spec.price.miss_prior is not None and spec.price.miss_prior > 0.05
    assert got == ref
    assert not spec.stats.drafts, spec.stats.drafts


def test_cheap_misses_still_verify_drafts(tiny_dir, monkeypatch):
    """The same drafts where a read is cheap (the tiny model's experts at 2 GB/s): verified, and
    output is still plain's (the test above is not vacuous)."""
    ref, got, spec = _drafted(tiny_dir, monkeypatch, read_rate=2e9)
    assert got == ref
    assert spec.stats.drafts.get("forced", 0) > 0
