"""The pure-CPU runner's torch threads (ModelRunner._torch_threads): prefill steps run on the
engine's own count (its kernel pool's) whatever an earlier engine or the caller left torch at,
decode steps on one, and an idle or closed engine gives the caller's setting back. An engine
dropped mid-decode used to leave torch at one thread, and the next engine's prefill then summed
its float32 GEMMs in another order: the resident tier's logits depended on the tests before it."""
from __future__ import annotations

import pytest
import torch

from freetoken import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


@pytest.fixture
def caller_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def spy_threads(llm, monkeypatch) -> list[tuple[str, int]]:
    """(phase, torch threads) of every forward the engine runs from now on."""
    seen, forward = [], llm.engine.model.forward

    def spy(ids, positions, ctx):
        seen.append((ctx.phase, torch.get_num_threads()))
        return forward(ids, positions, ctx)
    monkeypatch.setattr(llm.engine.model, "forward", spy)
    return seen


def test_prefill_runs_on_the_engines_threads_whatever_torch_was_left_at(tiny_dir, monkeypatch, caller_threads):
    llm = LLM(str(tiny_dir("qwen3_moe")), dtype="float32", num_threads=2)
    assert llm.engine.runner.kernel_pool is not None
    torch.set_num_threads(1)            # what an engine dropped mid-decode left behind
    seen = spy_threads(llm, monkeypatch)
    llm.generate([[5, 6, 7, 8]], GREEDY)
    assert {n for phase, n in seen if phase == "prefill"} == {2}
    assert {n for phase, n in seen if phase == "decode"} == {1}
    assert torch.get_num_threads() == 1         # idle: the caller's setting back
    llm.close()


def test_closing_mid_decode_gives_the_callers_threads_back(tiny_dir, caller_threads):
    llm = LLM(str(tiny_dir("qwen3_moe")), dtype="float32", num_threads=2)
    torch.set_num_threads(2)
    llm.engine.add_request("r", [5, 6, 7, 8], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
    for _ in range(3):                  # the prefill, then decode steps
        llm.engine.step()
    assert llm.engine.has_unfinished() and torch.get_num_threads() == 1
    llm.close()
    assert torch.get_num_threads() == 2


def test_a_prompts_logits_do_not_depend_on_the_threads_torch_was_left_at(tiny_dir, caller_threads):
    """The resident tier (torch GEMMs over the experts, int8 activations as the kernels round
    them) scores the same bits after torch was left at one thread as after it was at the pool's."""
    llm = LLM(str(tiny_dir("qwen3_moe", dtype="bfloat16")), dtype="bfloat16", moe_backend="resident",
              expert_format="mxfp4", num_threads=2)
    prompt = list(range(5, 45))
    torch.set_num_threads(2)
    ref = llm.score(prompt)
    torch.set_num_threads(1)
    assert torch.equal(llm.score(prompt), ref)
    llm.close()


def test_a_draft_models_runner_leaves_the_callers_threads(tiny_dir, caller_threads):
    """A draft model's runner runs once at start (its warm-up) and then inside the target's steps,
    where its catch-ups and the target's decode set torch's threads in turn: the caller's setting
    comes back when the target idles or closes, never the target's decode setting (one thread)."""
    path = tiny_dir("qwen3_moe")
    llm = LLM(str(path), dtype="float32", speculative="draft", draft_model=str(path), num_threads=2)
    llm.engine.spec.priced = False              # every draft goes through
    torch.set_num_threads(2)
    llm.generate([[5, 6, 7, 8, 9]], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert torch.get_num_threads() == 2
    # longer than 3 steps can finish: every draft is accepted, up to spec_max_draft + 1 tokens a step
    n = 3 * (llm.engine.cfg.spec_max_draft + 1) + 1
    llm.engine.add_request("r", [5, 6, 7, 8], SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    for _ in range(3):
        llm.engine.step()
    assert llm.engine.has_unfinished() and torch.get_num_threads() == 1
    llm.close()
    assert torch.get_num_threads() == 2
