"""A request whose engine work raises fails alone: its sampling (logits processor, grammar),
its detokenization or a forward over its batch. It ends with finish_reason "error", the
engine keeps stepping, the other requests get the very tokens they get without it, and no
KV block stays held."""
from __future__ import annotations

import pytest

from freetoken import LLM, SamplingParams

PROMPTS = {"a": [5, 6, 7, 8], "b": list(range(10, 40)), "c": [101, 3, 77, 9, 250, 14]}
FAULTY = [40, 41, 42, 43, 44]
STEPS = 10


def _greedy(**kw):
    return SamplingParams(max_tokens=STEPS, temperature=0.0, ignore_eos=True, **kw)


def _run(llm, prompts: dict, params: dict | None = None, setup=None):
    """Run the prompts in one engine batch: {rid: (tokens, finish_reason, error)}.
    setup(engine) runs once they are queued (to plant a fault in one of them)."""
    params = params or {}
    for rid, ids in prompts.items():
        llm.engine.add_request(rid, ids, params.get(rid, _greedy()))
    if setup:
        setup(llm.engine)
    got = {rid: [[], None, None] for rid in prompts}
    while llm.engine.has_unfinished():
        for o in llm.engine.step():
            got[o.request_id][0] += o.new_token_ids
            if o.finished:
                got[o.request_id][1:] = [o.finish_reason, o.error]
    return {rid: tuple(v) for rid, v in got.items()}


def _assert_idle(llm):
    eng = llm.engine
    assert not eng.has_unfinished() and not eng.seqs
    assert eng.blocks.available == eng.blocks.num_blocks - 1, "a KV block is still held"


def _check(llm, faulty_result, others, baseline):
    toks, reason, error = faulty_result
    assert reason == "error" and error and "injected" in error, faulty_result
    for rid in PROMPTS:
        assert others[rid] == baseline[rid], (rid, others[rid], baseline[rid])
    _assert_idle(llm)
    again = _run(llm, {"after": PROMPTS["a"]})      # the engine keeps serving
    assert again["after"][0] == baseline["a"][0]
    _assert_idle(llm)


@pytest.fixture(scope="module")
def llm(tiny_dir):
    # speculation off: its price is measured live, so which requests share a forward would vary run to run
    llm = LLM(str(tiny_dir("qwen3_moe")), dtype="float32", speculative="off")
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def baseline(llm):
    return _run(llm, PROMPTS)


def test_logits_processor_that_raises_fails_its_request_alone(llm, baseline):
    def boom(output_ids, logits):
        if len(output_ids) >= 3:                       # mid-decode, after three good tokens
            raise ValueError("injected grammar fault")
        return logits

    res = _run(llm, {**PROMPTS, "bad": FAULTY}, {"bad": _greedy(logits_processors=[boom])})
    assert len(res["bad"][0]) == 3
    _check(llm, res.pop("bad"), res, baseline)


def test_detokenizer_that_raises_fails_its_request_alone(llm, baseline):
    def plant(engine):
        seq = engine.seqs["bad"]
        add = seq.detok.add

        def boom(tok):
            if len(seq.output_ids) >= 2:
                raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected detokenizer fault")
            return add(tok)
        seq.detok.add = boom

    res = _run(llm, {**PROMPTS, "bad": FAULTY}, setup=plant)
    _check(llm, res.pop("bad"), res, baseline)


@pytest.mark.parametrize("when", ["prefill", "decode"])
def test_batched_forward_that_raises_reruns_each_request_alone(llm, baseline, when, monkeypatch):
    runner = llm.engine.runner
    run = runner.run
    calls = {"batched": 0}

    def flaky(batch):
        seqs = [s for s, _ in batch]
        bad = next((s for s in seqs if s.request_id == "bad"), None)
        prefill = any(n > 1 for _, n in batch)
        if bad is not None and (prefill if when == "prefill" else len(bad.output_ids) >= 2):
            calls["batched"] += len(batch) > 1
            raise RuntimeError("injected kernel fault")
        return run(batch)

    monkeypatch.setattr(runner, "run", flaky)
    res = _run(llm, {**PROMPTS, "bad": FAULTY})
    assert calls["batched"] >= 1                       # the fault hit a shared forward first
    _check(llm, res.pop("bad"), res, baseline)


def test_offline_generate_raises_after_the_others_finish(llm, baseline):
    def boom(output_ids, logits):
        raise ValueError("injected")

    with pytest.raises(RuntimeError, match="failed in the engine: ValueError: injected"):
        llm.generate([FAULTY, PROMPTS["a"]], [_greedy(logits_processors=[boom]), _greedy()][0])
    _assert_idle(llm)


def test_hybrid_model_fails_the_batch_of_a_raising_forward_and_keeps_serving(tiny_dir, monkeypatch):
    """A recurrent state may have advanced part way through the failed forward, so a rerun is
    not safe: the batch's requests fail; the engine serves the next ones."""
    llm = LLM(str(tiny_dir("qwen3_next")), dtype="float32")
    alone = _run(llm, {"a": PROMPTS["a"]})
    run = llm.engine.runner.run

    def flaky(batch):
        if any(s.request_id == "bad" for s, _ in batch):
            raise RuntimeError("injected kernel fault")
        return run(batch)

    monkeypatch.setattr(llm.engine.runner, "run", flaky)
    res = _run(llm, {"x": PROMPTS["b"], "bad": FAULTY})
    assert res["bad"][1] == "error" and res["x"][1] == "error"
    _assert_idle(llm)
    assert _run(llm, {"a": PROMPTS["a"]}) == alone
    _assert_idle(llm)
    llm.close()


def test_seeded_sampling_of_the_others_is_unchanged(llm):
    """Each request is sampled once per step: a fault in one must not make the others' seeded
    generators draw again."""
    seeded = {rid: SamplingParams(max_tokens=STEPS, temperature=0.9, seed=7 + i, ignore_eos=True)
              for i, rid in enumerate(PROMPTS)}
    ref = _run(llm, PROMPTS, seeded)

    def boom(output_ids, logits):
        if len(output_ids) >= 2:
            raise ValueError("injected grammar fault")
        return logits

    bad = SamplingParams(max_tokens=STEPS, temperature=0.9, seed=1, logits_processors=[boom])
    order = {**PROMPTS, "bad": FAULTY}                 # sampled after the others in each step
    res = _run(llm, order, {**seeded, "bad": bad})
    assert res.pop("bad")[1] == "error"
    assert res == ref
    _assert_idle(llm)
