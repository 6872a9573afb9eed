"""Tiny random expert pools and a reference for the tiered-backend tests."""
from __future__ import annotations

import time

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken import LLM, SamplingParams

from freetoken.experts.memory.pool import ExpertPool, ExpertSpec
from freetoken.experts.execution.resident import ResidentExperts
from freetoken.loading.convert import convert


def make_pool(layers=3, experts=8, hidden=16, inter=8, bias=False, activation="silu", seed=0,
              dtype=torch.float32) -> ExpertPool:
    g = torch.Generator().manual_seed(seed)
    n = layers * experts
    banks = {"gate_up": torch.randn(n, 2 * inter, hidden, generator=g, dtype=dtype) / hidden ** 0.5,
             "down": torch.randn(n, hidden, inter, generator=g, dtype=dtype) / inter ** 0.5}
    if bias:
        banks["gate_up_bias"] = torch.randn(n, 2 * inter, generator=g) * 0.1
        banks["down_bias"] = torch.randn(n, hidden, generator=g) * 0.1
    return ExpertPool(banks, layers, experts, ExpertSpec(hidden, inter, activation=activation))


def random_step(pool: ExpertPool, tokens: int, k: int, g: torch.Generator, hot: int | None = None):
    """hidden [T,H], topk ids [T,K] (distinct per token; from the first `hot` experts if set), weights."""
    E = pool.num_experts
    pick = E if hot is None else max(hot, k)
    ids = torch.stack([torch.randperm(pick, generator=g)[:k] for _ in range(tokens)])
    w = torch.softmax(torch.randn(tokens, k, generator=g), -1)
    x = torch.randn(tokens, pool.spec.hidden, generator=g)
    return x, ids, w


def reference(pool: ExpertPool):
    return ResidentExperts(pool, torch.device("cpu"))


def torch_host(pool: ExpertPool):
    """The CPU branch on plain torch: deterministic and cheap for the many small cases.
    (The fast kernels of cpu.py are exercised by the tests that pass fast=True.)"""
    from freetoken.experts.execution.host_exec import TorchHostExecutor
    return TorchHostExecutor(pool)


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny tensors: torch's intra-op threads only add barrier waits (badly so on a loaded box)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# the disk tier's end-to-end tests (test_disk_lookahead.py, test_disk_handoff.py): one tiny MoE
# checkpoint as an int8 FTW and what the resident pool gives for it
DISK_PROMPT = [5, 17, 3, 99, 42, 7, 250, 11, 64, 8, 300]
DISK_GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def disk_outputs(llm: LLM):
    """The prompt's logits and greedy tokens of the prompt and its first 5 tokens."""
    return llm.score(DISK_PROMPT), [c.token_ids for c in llm.generate([DISK_PROMPT, DISK_PROMPT[:5]], DISK_GREEDY)]


def resident_ftw(tiny_dir, folder):
    """(path, resident outputs) of the tiny qwen3_moe converted into `folder`."""
    out = folder / "m.ftw"
    convert(tiny_dir("qwen3_moe"), out, expert_format="int8", dtype="float32")
    ref = LLM(str(out), dtype="float32")
    want = disk_outputs(ref)
    ref.close()
    return out, want


def outputs_hold_under_delayed_reads(llm: LLM, want, delays: list[float], examples: int, keys: int = 16):
    """Hypothesis draws a delay for each read (by flat id mod `keys`, so reads land in any order):
    the disk tier's `disk_outputs` stay `want` bit for bit and its host cache consistent."""
    experts = llm.engine.model.experts
    reader = experts.cache.reader
    read = reader.read

    @settings(max_examples=examples, deadline=None)
    @given(drawn=st.lists(st.sampled_from(delays), min_size=keys, max_size=keys))
    def check(drawn):
        reader.read = lambda flat, *a: (time.sleep(drawn[flat % keys]), read(flat, *a))[1]
        g_logits, g_tokens = disk_outputs(llm)
        assert torch.equal(g_logits, want[0])
        assert g_tokens == want[1]
        experts.cache.check()

    try:
        check()
    finally:
        reader.read = read
