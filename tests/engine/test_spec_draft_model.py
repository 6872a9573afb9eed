"""A separate draft model (`--speculative draft --draft-model PATH`): output is token for token
plain decoding's with drafts right (the target as its own draft), half right (the target's
weights with noise) and wrong (an unrelated dense model), greedy and seeded sampling, in mixed
batches; the draft's own KV after rejections equals a fresh run over the accepted tokens; a
draft model with another vocabulary is refused in one line; its drafting time is priced."""
from __future__ import annotations

import random
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from freetoken import LLM, SamplingParams
from freetoken.config import EngineConfig
from freetoken.engine.spec.drafters import Draft
from freetoken.engine.spec.draft_model import DraftModelDrafter
from freetoken.errors import InvalidRequestError

from test_speculative import generate   # token ids per prompt, all in one batch

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def ids_for(n, seed):
    r = random.Random(seed)
    return [r.randrange(3, 400) for _ in range(n)]


@pytest.fixture(scope="module")
def noisy_copy(tmp_path_factory):
    """noisy_copy(src, sigma) -> src's checkpoint with Gaussian noise (sigma x each matrix's std)
    on every weight matrix: a draft that agrees with the target often, not always."""
    root = tmp_path_factory.mktemp("noisy")

    def make(src, sigma):
        dst = root / f"{src.name}-{sigma}"
        if not dst.exists():
            shutil.copytree(src, dst)
            w = load_file(dst / "model.safetensors")
            g = torch.Generator().manual_seed(1)
            for name, t in w.items():
                if t.is_floating_point() and t.dim() == 2:
                    w[name] = t + sigma * t.std() * torch.randn(t.shape, generator=g)
            save_file(w, dst / "model.safetensors", metadata={"format": "pt"})
        return dst
    return make


def drafting(target, draft, **opts):
    llm = LLM(str(target), dtype="float32", speculative="draft", draft_model=str(draft), **opts)
    llm.engine.spec.priced = False            # every draft goes through, whatever it would cost
    return llm


@pytest.mark.parametrize("which", ["right", "half", "wrong"])
def test_greedy_identity_with_a_draft_model(tiny_dir, noisy_copy, which):
    target = tiny_dir("qwen3_moe")
    draft = {"right": lambda: target, "half": lambda: noisy_copy(target, 0.05),
             "wrong": lambda: tiny_dir("qwen3", seed=3)}[which]()
    prompts = [ids_for(20, s) for s in range(3)]
    plain = LLM(str(target), dtype="float32", speculative="off")
    ref = generate(plain, prompts, GREEDY)
    llm = drafting(target, draft)
    assert generate(llm, prompts, GREEDY) == ref
    s = llm.engine.spec.summary()
    st = s["drafters"]["draft"]
    assert st["proposed_tokens"] > 0
    if which == "right":
        assert st["accepted_tokens"] == st["proposed_tokens"]
    elif which == "half":
        assert 0 < st["accepted_tokens"] < st["proposed_tokens"]
        assert s["draft_model"]["rows_rolled_back"] > 0
    llm.engine.blocks.check([])


def test_mixed_batch_greedy_and_seeded_sampling(tiny_dir, noisy_copy):
    """Greedy and seeded sampled sequences in one batch: a draft model is deterministic (q one-hot
    on its argmax), so the verifier's rule keeps each seed's tokens exactly."""
    target = tiny_dir("qwen3_moe")
    prompts = [ids_for(18, 10 + s) for s in range(4)]
    params = [GREEDY, SamplingParams(max_tokens=24, temperature=0.9, seed=7, ignore_eos=True),
              SamplingParams(max_tokens=20, temperature=0.7, top_p=0.9, top_k=20, seed=3, ignore_eos=True,
                             frequency_penalty=0.3), GREEDY]
    ref = generate(LLM(str(target), dtype="float32", speculative="off"), prompts, params)
    for draft in (target, noisy_copy(target, 0.05)):
        assert generate(drafting(target, draft), prompts, params) == ref


def test_rollback_leaves_the_drafts_kv_as_a_fresh_run(tiny_dir, noisy_copy):
    """Step by step with half-right drafts: each shadow's computed KV rows equal those of a fresh
    draft engine that ran the same tokens in one chunk (the rejected rows are gone), and its
    block table holds only what its computed rows need."""
    target = tiny_dir("qwen3_moe")
    draft_path = noisy_copy(target, 0.05)
    llm = drafting(target, draft_path, kv_block_size=4)
    drafter = llm.engine.spec.drafters["draft"]
    fresh = LLM(str(draft_path), dtype="float32", speculative="off", prefix_cache=False, kv_block_size=4).engine
    e = llm.engine
    e.add_request("r", ids_for(21, 5), SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
    checked = 0
    while e.has_unfinished():
        e.step()
        s = drafter._seqs.get("r")
        if s is None or s.num_computed == 0:
            continue
        n = s.num_computed
        assert len(s.block_table) == -(-n // 4)
        ref = fresh.runner
        probe = type(s)("ref", list(s.prompt_ids[:n]), s.params, None, 0)
        fresh.blocks.allocate(probe, n)
        ref.run([(probe, n)])
        for i, ca in ref.kv.items():
            cb = drafter.runner.kv[i]
            torch.testing.assert_close(cb.k[drafter.runner._slots(s, n)], ca.k[ref._slots(probe, n)],
                                       rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(cb.v[drafter.runner._slots(s, n)], ca.v[ref._slots(probe, n)],
                                       rtol=1e-4, atol=1e-5)
        fresh.blocks.release(probe)
        checked += 1
    assert checked >= 3 and drafter.rolled_back > 0


def test_a_draft_model_with_another_vocabulary_is_refused_in_one_line(tiny_dir):
    target, other = tiny_dir("qwen3_moe"), tiny_dir("qwen3", vocab=600)
    with pytest.raises(InvalidRequestError) as e:
        LLM(str(target), dtype="float32", speculative="draft", draft_model=str(other))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("draft_model: ") and "tokenizer differs" in msg


def test_options_are_checked():
    with pytest.raises(InvalidRequestError, match="draft needs --draft-model"):
        EngineConfig(model="x", speculative="draft")
    with pytest.raises(InvalidRequestError, match="only used with --speculative draft or auto"):
        EngineConfig(model="x", speculative="suffix", draft_model="y")
    EngineConfig(model="x", speculative="auto", draft_model="y")


def test_drafting_time_is_priced(tiny_dir):
    """The draft model's measured seconds per drafted token enter the verify's price: a draft
    that costs more than the tokens it wins is not run; a cheap one of the same acceptance is."""
    target = tiny_dir("qwen3_moe")
    llm = LLM(str(target), dtype="float32", speculative="draft", draft_model=str(target))
    spec = llm.engine.spec
    d: DraftModelDrafter = spec.drafters["draft"]
    for _ in range(60):
        for n in (1, 2, 3, 5, 9):
            spec.price.observe(n, min(16, 4 * n), 0.010 + 0.0005 * n)
    for _ in range(300):
        spec.stats.observe("draft", 0, 8, 8)        # always right
    probe = Draft((0,) * 8, "draft", 0)
    base = spec.price.seconds(1)
    d.step_s, d.row_s = 0.0005, 0.0001                   # drafting is cheap: a long draft pays
    assert spec._price(probe, 8, 1.0, 1, base, lambda k: d.seconds(k, 1))[0] >= 6
    assert spec._price(probe, 8, 1.0, 1, base, lambda k: d.seconds(k, 5000))[0] == 0  # far behind: 0.5 s first
    d.step_s = 0.02                                      # each drafted token costs two plain steps
    assert spec._price(probe, 8, 1.0, 1, base, lambda k: d.seconds(k, 1))[0] == 0
    assert spec._price(probe, 8, 1.0, 1, base)[0] >= 6   # once drafted, its time is spent
    prompts = [ids_for(20, 1)]
    generate(llm, prompts, GREEDY)                       # priced, with the target as its own draft
    assert d.step_s is not None and d.step_s > 0 and d.row_s is not None and d.row_s > 0
    assert d.behind("nobody", 30) == 30
