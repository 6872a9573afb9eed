"""Speculative decoding is exact: with drafts forced right, wrong and half right, greedy output
is token for token what plain decoding gives (every family, mixed batches, prefix-cache hits,
preemption, expert tiers, processors and penalties per position, stop rules), rejected rows
leave the KV pool and the cache as if never drafted, and sampled output keeps its distribution."""
from __future__ import annotations

import random

import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.engine.spec.drafters import Draft

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def ids_for(n, seed):
    r = random.Random(seed)
    return [r.randrange(3, 400) for _ in range(n)]


class ForcedDrafter:
    """Drafts from the known plain output: right, wrong (every token shifted), half (first half
    right), or nothing for prompts not in `only`."""
    name = "forced"

    def __init__(self, prompts, refs, mode, only=None, vocab=400):
        self.pairs = list(zip(prompts, refs))
        self.mode, self.only, self.vocab = mode, only, vocab
        self.calls = 0

    def observe(self, key, tokens, start=0):
        pass

    def forget(self, key):
        pass

    def propose(self, ctx, k, key=None):
        for i, (p, r) in enumerate(self.pairs):
            if ctx[:len(p)] != p or len(ctx) < len(p) or (self.only is not None and i not in self.only):
                continue
            done = len(ctx) - len(p)
            if r[:done] != ctx[len(p):]:
                continue
            out = list(r[done:done + k])
            if self.mode == "wrong":
                out = [(t + 1) % self.vocab for t in out]
            elif self.mode == "half":
                h = max(1, len(out) // 2)
                out = out[:h] + [(t + 1) % self.vocab for t in out[h:]]
            elif self.mode == "random":
                rng = random.Random(len(ctx))
                out = [t if rng.random() < 0.7 else (t + 1) % self.vocab for t in out]
            if out:
                self.calls += 1
                return Draft(tuple(out), "forced", 0)
        return None


def force(llm, drafter):
    spec = llm.engine.spec
    assert spec is not None
    spec.priced = False
    spec.drafters = {"forced": drafter}
    return spec


def check_idle(llm):
    """No request holds a block; every block is free or the prefix tree's (nothing leaked)."""
    e = llm.engine
    e.blocks.check([])
    e.prefix.check()


def generate(llm, prompts, params) -> list[list[int]]:
    """Token ids per prompt; `params` one SamplingParams or one per prompt."""
    if isinstance(params, SamplingParams):
        return [o.token_ids for o in llm.generate(prompts, params)]
    e, got = llm.engine, {}
    for i, (p, sp) in enumerate(zip(prompts, params)):
        e.add_request(f"m{i}", p, sp)
        got[f"m{i}"] = []
    while e.has_unfinished():
        for o in e.step():
            got[o.request_id] += o.new_token_ids
    return [got[f"m{i}"] for i in range(len(prompts))]


def plain_and_spec(path, prompts, params=GREEDY, **opts):
    plain = LLM(str(path), dtype="float32", speculative="off", **opts)
    return generate(plain, prompts, params), LLM(str(path), dtype="float32", **opts)


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral", "deepseek_v3", "glm4_moe", "minimax_m2", "qwen2_moe"])
def test_greedy_identity_with_drafts_right_wrong_half(tiny_dir, arch):
    prompts = [ids_for(20, s) for s in range(3)]
    ref, llm = plain_and_spec(tiny_dir(arch), prompts)
    for mode in ("right", "wrong", "half", "random"):
        d = ForcedDrafter(prompts, ref, mode)
        spec = force(llm, d)
        got = [o.token_ids for o in llm.generate(prompts, GREEDY)]
        assert got == ref, (arch, mode)
        assert d.calls > 0
        check_idle(llm)
    s = spec.stats.summary()["forced"]
    assert s["accepted_tokens"] > 0 and s["proposed_tokens"] > s["accepted_tokens"]


@pytest.mark.parametrize("arch", ["qwen3_next", "qwen3_5_moe", "gpt_oss", "deepseek_v4"])
def test_greedy_identity_on_models_with_a_state(tiny_dir, arch):
    """Recurrent (gated DeltaNet), sliding-window and compressed (DeepSeek-V4) states: a rejected
    draft restores the snapshot taken before the verify."""
    prompts = [ids_for(20, s) for s in range(3)]
    ref, llm = plain_and_spec(tiny_dir(arch), prompts)
    assert llm.engine.model.make_state() is not None
    for mode in ("right", "wrong", "half", "random"):
        force(llm, ForcedDrafter(prompts, ref, mode))
        assert generate(llm, prompts, GREEDY) == ref, (arch, mode)
        check_idle(llm)


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_next"])
def test_one_sequence_alone_verifying(tiny_dir, arch):
    """A sequence verifying alone takes the runner's few-op verify path (its own metadata, the
    lm_head once over its rows): greedy output is plain's with drafts right, wrong and half right,
    a recurrent state restored after a rejection included."""
    prompts = [ids_for(20, 42)]
    ref, llm = plain_and_spec(tiny_dir(arch), prompts)
    for mode in ("right", "wrong", "half"):
        d = ForcedDrafter(prompts, ref, mode)
        force(llm, d)
        assert generate(llm, prompts, GREEDY) == ref, mode
        assert d.calls > 0
        check_idle(llm)


def test_mixed_batch_drafting_and_plain_sampled_sequences(tiny_dir):
    """Drafts for two of four sequences; the others (one seeded sampling) are untouched."""
    prompts = [ids_for(18, 10 + s) for s in range(4)]
    params = [GREEDY, GREEDY, SamplingParams(max_tokens=24, temperature=0.9, seed=7, ignore_eos=True), GREEDY]
    ref, llm = plain_and_spec(tiny_dir("qwen3_moe"), prompts, params)
    for mode in ("right", "half"):
        force(llm, ForcedDrafter(prompts, ref, mode, only={0, 3}))
        assert generate(llm, prompts, params) == ref
        check_idle(llm)


def test_processors_penalties_and_stop_rules_per_position(tiny_dir):
    """A processor that depends on the tokens so far, repetition/presence penalties, a stop
    token and max_tokens inside a draft: the same output as plain decoding."""
    def no_repeat_last(out, logits):
        if out:
            logits[out[-1]] = float("-inf")
        return logits

    prompts = [ids_for(16, 20 + s) for s in range(3)]

    def params(stop=()):
        return SamplingParams(max_tokens=19, temperature=0.0, ignore_eos=True, repetition_penalty=1.3,
                              presence_penalty=0.5, logits_processors=[no_repeat_last], stop_token_ids=list(stop))

    ref, llm = plain_and_spec(tiny_dir("qwen3_moe"), prompts, params())
    stop = [r[7] for r in ref]                     # each stops at its 8th token
    plain = LLM(str(tiny_dir("qwen3_moe")), dtype="float32", speculative="off")
    ref_stop = [o.token_ids for o in plain.generate(prompts, params(stop))]
    assert all(len(r) <= 8 for r in ref_stop)
    for mode in ("right", "wrong", "half"):
        force(llm, ForcedDrafter(prompts, ref, mode))
        assert [o.token_ids for o in llm.generate(prompts, params())] == ref
        force(llm, ForcedDrafter(prompts, ref, mode))
        outs = llm.generate(prompts, params(stop))
        assert [o.token_ids for o in outs] == ref_stop
        assert all(len(r) == 19 for r in ref)
        check_idle(llm)


def test_prefix_cache_hits_and_preemption(tiny_dir):
    system = ids_for(70, 99)
    prompts = [system + ids_for(12, 30 + s) for s in range(4)]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    opts = dict(kv_block_size=8, max_num_batched_tokens=48, kv_cache_gib=25 * 8 * 512 / 2**30, max_num_seqs=4)
    ref, llm = plain_and_spec(tiny_dir("qwen3_moe"), prompts, params, **opts)
    for mode in ("right", "half", "wrong"):
        force(llm, ForcedDrafter(prompts, ref, mode))
        before = llm.engine.scheduler.num_preemptions
        outs = llm.generate(prompts, params)
        assert [o.token_ids for o in outs] == ref, mode
        assert llm.engine.scheduler.num_preemptions > before, "the pool was meant to run out"
        assert any(o.num_cached_tokens for o in outs)
        check_idle(llm)


@pytest.mark.parametrize("tier", [dict(moe_backend="cpu"), dict(moe_backend="offload", expert_cache_slots=8),
                                  dict(moe_backend="hybrid", expert_cache_slots=5),
                                  dict(expert_tier="disk", host_cache_slots=6)])
def test_greedy_identity_on_expert_tiers(tiny_dir, tier):
    prompts = [ids_for(20, 40 + s) for s in range(2)]
    ref, llm = plain_and_spec(tiny_dir("qwen3_moe"), prompts, **tier)
    for mode in ("right", "half"):
        force(llm, ForcedDrafter(prompts, ref, mode))
        assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == ref, (tier, mode)


def test_rejected_drafts_leave_kv_as_never_drafted(tiny_dir):
    """Step by step with every draft wrong: the sequence's KV rows equal a plain run's, its
    block table holds only the blocks its computed rows need, and nothing leaks."""
    path = tiny_dir("qwen3_moe")
    prompt = ids_for(21, 5)
    plain = LLM(str(path), dtype="float32", speculative="off", kv_block_size=4, prefix_cache=False)
    ref = plain.generate([prompt], GREEDY)[0].token_ids
    spec_llm = LLM(str(path), dtype="float32", kv_block_size=4, prefix_cache=False)
    force(spec_llm, ForcedDrafter([prompt], [ref], "wrong"))
    a, b = plain.engine, spec_llm.engine
    p = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    a.add_request("r", prompt, p)
    b.add_request("r", prompt, p)
    while a.has_unfinished():
        oa, ob = a.step(), b.step()
        assert [o.new_token_ids for o in oa] == [o.new_token_ids for o in ob]
        if "r" not in a.seqs:
            break
        sa, sb = a.seqs["r"], b.seqs["r"]
        assert sa.num_computed == sb.num_computed and sa.output_ids == sb.output_ids
        assert len(sb.block_table) == -(-sb.num_computed // 4)
        for i, ca in a.runner.kv.items():
            cb = b.runner.kv[i]
            ra = a.runner._slots(sa, sa.num_computed)
            rb = b.runner._slots(sb, sb.num_computed)
            torch.testing.assert_close(cb.k[rb], ca.k[ra], rtol=1e-4, atol=1e-5)
            if ca.v is not None:
                torch.testing.assert_close(cb.v[rb], ca.v[ra], rtol=1e-4, atol=1e-5)
    b.blocks.check([])


def test_seeded_sampling_gives_the_same_tokens_with_and_without_drafts(tiny_dir):
    """The acceptance rule draws each position's token as plain decoding would (one uniform a
    token): a seed's output does not depend on what was drafted."""
    prompts = [ids_for(15, 60 + s) for s in range(3)]
    params = [SamplingParams(max_tokens=20, temperature=t, top_p=tp, top_k=tk, seed=s, ignore_eos=True,
                             frequency_penalty=0.3)
              for s, (t, tp, tk) in enumerate([(0.8, 0.9, 0), (1.2, 1.0, 40), (0.6, 0.95, 10)])]
    ref, llm = plain_and_spec(tiny_dir("qwen3_moe"), prompts, params)
    for mode in ("right", "wrong", "half", "random"):
        force(llm, ForcedDrafter(prompts, ref, mode))
        assert generate(llm, prompts, params) == ref, mode


# chi-square critical values at p = 0.001 for 1..5 degrees of freedom
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52}


def test_acceptance_rule_keeps_the_distribution_chi_square():
    """On a 6-token vocabulary: over many seeds, the token the rule emits for a draft d follows
    softmax(logits / T) (chi-square), and d is accepted with probability p(d)."""
    from freetoken.engine.sequence import Sequence
    from freetoken.engine.spec.verify import choose
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    p = torch.softmax(logits / 0.8, 0).double()
    n = 6000
    for d in (0, 2, 5):
        counts, acc = torch.zeros(6), 0
        for seed in range(n):
            seq = Sequence("s", [1, 2], SamplingParams(temperature=0.8, seed=seed), None, 0)
            tok, ok = choose(logits, seq, d)
            counts[tok] += 1
            acc += ok
            assert ok == (tok == d)
        expected = p * n
        keep = expected > 5                        # the chi-square approximation's usual rule
        chi2 = float(((counts.double()[keep] - expected[keep]) ** 2 / expected[keep]).sum())
        assert chi2 < CHI2_999[int(keep.sum()) - 1], (d, counts, expected)
        assert abs(acc / n - float(p[d])) < 4 * (float(p[d]) * (1 - float(p[d])) / n) ** 0.5 + 1e-3


@pytest.mark.parametrize("arch", ["qwen3_next", "gpt_oss"])
def test_rejected_drafts_leave_the_state_as_never_drafted(tiny_dir, arch):
    """Models with a state: whenever the speculative run has computed as many tokens as the
    plain one, its state tensors equal the plain run's (a rejected draft was rolled back)."""
    path = tiny_dir(arch)
    prompt = ids_for(19, 8)
    plain = LLM(str(path), dtype="float32", speculative="off", prefix_cache=False)
    ref = plain.generate([prompt], GREEDY)[0].token_ids
    spec_llm = LLM(str(path), dtype="float32", prefix_cache=False)
    force(spec_llm, ForcedDrafter([prompt], [ref], "half"))
    p = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    states = {}
    for name, llm in (("plain", plain), ("spec", spec_llm)):
        e = llm.engine
        e.add_request("r", prompt, p)
        while e.has_unfinished():
            e.step()
            seq = e.seqs.get("r")
            if seq is not None and seq.state is not None:
                assert seq.state.position == seq.num_computed
                states.setdefault(name, {})[seq.num_computed] = seq.state.snapshot()
    common = sorted(set(states["plain"]) & set(states["spec"]))
    assert len(common) >= 3
    for n in common:
        a, b = states["plain"][n], states["spec"][n]
        for part in a.parts:
            for t in a.parts[part].tensors:
                torch.testing.assert_close(getattr(b.parts[part], t), getattr(a.parts[part], t),
                                           rtol=1e-4, atol=1e-5, msg=f"{arch} {part}.{t} at {n}")


def test_auto_drafts_only_where_the_price_says_it_pays(tiny_dir):
    """With steps priced a + b*positions + c*experts: a bucket whose drafts are never accepted
    gets k = 0, one whose drafts always are gets a long draft; where each drafted position costs
    more than a plain step nothing pays."""
    llm = LLM(str(tiny_dir("qwen3_moe")), dtype="float32")
    spec = llm.engine.spec
    for _ in range(60):
        for n in (1, 2, 3, 5, 9):
            u = min(16, 4 * n)                       # 2 layers x 8 experts: at most 16 distinct
            spec.price.observe(n, u, 0.010 + 0.0005 * n + 0.0001 * u)
    for _ in range(300):
        spec.stats.observe("suffix", 0, 8, 0)        # bucket 0: never right
        spec.stats.observe("suffix", 11, 8, 8)       # bucket 11: always right
    base = spec.price.seconds(1)
    never = Draft(tuple(range(8)), "suffix", 0)
    always = Draft(tuple(range(8)), "suffix", 11)
    assert spec._price(never, 8, 1.0, 1, base)[0] == 0
    k_cheap = spec._price(always, 8, 1.0, 1, base)[0]
    assert k_cheap >= 6
    spec.price.samples.clear()
    for _ in range(60):
        for n in (1, 2, 3, 5, 9):                    # each drafted position costs 1.5 plain steps
            spec.price.observe(n, min(16, 4 * n), 0.010 + 0.015 * (n - 1))
    spec.price._fit()
    assert spec._price(always, 8, 1.0, 1, spec.price.seconds(1))[0] == 0


def test_drafter_statistics_reach_metrics(tiny_dir):
    from freetoken.server.operations.metrics import flatten
    prompts = [ids_for(20, 3)]
    ref, llm = plain_and_spec(tiny_dir("qwen3_moe"), prompts)
    force(llm, ForcedDrafter(prompts, ref, "half"))
    generate(llm, prompts, GREEDY)
    names = {n for n, _ in flatten(llm.engine.expert_stats())}
    for field in ("drafts", "proposed_tokens", "accepted_tokens", "mean_accepted_length"):
        assert f"speculative_drafters_forced_{field}" in names
    s = llm.engine.expert_stats()["speculative"]["drafters"]["forced"]
    assert 0 < s["accepted_tokens"] < s["proposed_tokens"]


def test_a_prompt_is_indexed_in_its_own_step(tiny_dir):
    """The drafters index a prompt in the step that takes it (its prefill), not in the first
    decode step: right after that step a periodic prompt's lookup continues the period."""
    llm = LLM(str(tiny_dir("qwen3_moe")), dtype="float32")
    eng = llm.engine
    prompt = [11, 12, 13, 14, 15] * 6
    eng.add_request("p", prompt, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    while not eng.seqs["p"].output_ids:
        eng.step()
    d = eng.spec.drafters["ngram"].propose(prompt, 5, key="p")
    assert d is not None and list(d.tokens) == [11, 12, 13, 14, 15]
    while eng.has_unfinished():
        eng.step()


def test_a_request_that_ends_in_its_prefill_leaves_no_drafter_state(tiny_dir):
    """A prompt indexed in its own step is forgotten like any other request once it ends, even
    when it ends in that step (max_tokens 1) and never reaches a decode step."""
    llm = LLM(str(tiny_dir("qwen3_moe")), dtype="float32")
    eng = llm.engine
    prompt = [11, 12, 13, 14, 15] * 6
    eng.add_request("p", prompt, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    eng.add_request("q", [7, 8, 9], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    while eng.has_unfinished():
        eng.step()
    assert eng.spec.drafters["ngram"].propose(prompt, 5, key="p") is None
