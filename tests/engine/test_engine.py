"""End-to-end engine behaviour: stops, seeds, chunked prefill, preemption, aborts."""
from __future__ import annotations

import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.errors import PromptTooLongError


@pytest.fixture(scope="module")
def llm(tiny_dir):
    return LLM(str(tiny_dir("qwen3_moe")), dtype="float32")


def test_max_tokens_and_finish_reason(llm):
    out = llm.generate(["hello world"], SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))[0]
    assert len(out.token_ids) == 5 and out.finish_reason == "length"
    assert out.text == llm.tokenizer.decode(out.token_ids)


def test_stop_token_ids_end_generation(llm):
    free = llm.generate(["hello"], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))[0]
    stop_at = free.token_ids[3]
    out = llm.generate(["hello"], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True,
                                                 stop_token_ids=[stop_at]))[0]
    first = free.token_ids.index(stop_at)
    assert out.token_ids == free.token_ids[:first + 1] and out.finish_reason == "stop"


def test_stop_string_is_cut_and_never_emitted(llm):
    free = llm.generate(["the quick"], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))[0]
    text = free.text
    stop = text[5:8]
    assert stop
    engine = llm.engine
    engine.add_request("stop", llm.tokenizer.encode("the quick"),
                       SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, stop=[stop]))
    pieces, reason = [], None
    while engine.has_unfinished():
        for o in engine.step():
            pieces.append(o.new_text)
            reason = o.finish_reason or reason
    streamed = "".join(pieces)
    assert reason == "stop" and streamed == text[: text.find(stop)] and stop not in streamed


def test_seeded_sampling_is_reproducible_and_batch_independent(llm):
    p = SamplingParams(max_tokens=12, temperature=1.0, seed=1234, ignore_eos=True)
    alone = llm.generate(["hello world"], p)[0].token_ids
    together = llm.generate(["the quick brown", "hello world", "fox"], p)[1].token_ids
    other = llm.generate(["hello world"], SamplingParams(max_tokens=12, temperature=1.0, seed=99,
                                                         ignore_eos=True))[0].token_ids
    assert alone == together and alone != other


def test_chunked_prefill_and_tiny_kv_with_preemption_give_same_tokens(tiny_dir):
    d = str(tiny_dir("qwen3_moe"))
    prompts = [list(range(10 + i, 40 + i)) for i in range(4)]
    p = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    ref = [c.token_ids for c in LLM(d, dtype="float32").generate(prompts, p)]
    # 512 B of KV per token here: 8 blocks of 16 tokens hold the prompts that are admitted
    # (whole prompts only) but not two of them grown to 70 tokens.
    small = LLM(d, dtype="float32", kv_cache_gib=8 * 16 * 512 / 2**30, max_num_batched_tokens=24, kv_block_size=16)
    preempted = []
    small.engine.on_preempt(preempted.append)
    assert [c.token_ids for c in small.generate(prompts, p)] == ref
    assert preempted, "the KV budget was meant to force preemption"


def test_abort_frees_kv_at_once(llm):
    engine = llm.engine
    free_before = engine.blocks.available        # free, or held only by the prefix cache
    engine.add_request("a", list(range(40)), SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    assert engine.blocks.available < free_before
    engine.abort_request("a")
    assert engine.blocks.available == free_before
    outs = engine.step()
    assert [o.finish_reason for o in outs] == ["abort"] and not engine.has_unfinished()


def test_prompt_longer_than_context_raises(tiny_dir):
    small = LLM(str(tiny_dir("qwen3_moe")), dtype="float32", max_model_len=32)
    with pytest.raises(PromptTooLongError, match="32"):
        small.generate([list(range(40))], SamplingParams(max_tokens=2))


def test_generation_stops_at_context_end(tiny_dir):
    small = LLM(str(tiny_dir("qwen3_moe")), dtype="float32", max_model_len=32)
    out = small.generate([list(range(28))], SamplingParams(max_tokens=50, ignore_eos=True))[0]
    assert len(out.token_ids) == 4 and out.finish_reason == "length"


def test_score_matches_generate_logits(llm):
    ids = list(range(3, 30))
    a, b = llm.score(ids), llm.score(ids)
    assert torch.equal(a, b) and a.shape[0] == len(ids)


def test_step_output_names_what_stopped_it(llm):
    free = llm.generate(["the quick"], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))[0]
    stop = free.text[5:8]
    engine = llm.engine
    engine.add_request("why", llm.tokenizer.encode("the quick"),
                       SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, stop=["zzzz", stop]))
    last = None
    while engine.has_unfinished():
        for o in engine.step():
            last = o
    assert last.finish_reason == "stop" and last.stop_reason == stop
