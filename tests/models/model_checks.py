"""Shared engine-vs-reference checks for every architecture: each
test file calls these with its own checkpoints. Checkpoints are written by transformers'
own config classes (via make-tiny or `save_hf_checkpoint`); the reference is transformers."""
from __future__ import annotations

import torch

from freetoken import LLM, SamplingParams
from freetoken.config import EngineConfig
from freetoken.engine.block_manager import BlockManager
from freetoken.engine.model_runner import ModelRunner
from freetoken.engine.sequence import Sequence
from freetoken.loading.loader import load_model
from freetoken.memory.resolve import resolve

from helpers import assert_logits_close


def ids_for(n, seed=0, vocab=500):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def _capture():
    seen = []

    def proc(out_ids, logits):
        seen.append(logits.clone())
        return logits
    return seen, proc


def check_incremental_equals_full(model_dir, prompt_len=11, steps=12):
    llm = LLM(str(model_dir), dtype="float32")
    prompt = ids_for(prompt_len, seed=5)
    seen, proc = _capture()
    out = llm.generate([prompt], SamplingParams(max_tokens=steps, temperature=0.0, logits_processors=[proc],
                                                ignore_eos=True))[0]
    full = llm.score(prompt + out.token_ids)
    assert_logits_close(torch.stack(seen), full[prompt_len - 1: prompt_len - 1 + len(seen)])


def check_batch_equals_single(model_dir):
    d = str(model_dir)
    prompts = [ids_for(n, seed=n) for n in (5, 17, 9, 30)]
    params = dict(max_tokens=6, temperature=0.0, ignore_eos=True)
    batched = LLM(d, dtype="float32", max_num_batched_tokens=24)   # chunked prefill next to decodes
    caps = [_capture() for _ in prompts]
    for i, ((seen, proc), p) in enumerate(zip(caps, prompts)):
        batched.engine.add_request(f"r{i}", p, SamplingParams(logits_processors=[proc], **params))
    while batched.engine.has_unfinished():
        batched.engine.step()
    single = LLM(d, dtype="float32")
    for (seen_b, _), p in zip(caps, prompts):
        seen_s, proc = _capture()
        single.generate([p], SamplingParams(logits_processors=[proc], **params))
        assert len(seen_b) == len(seen_s) == 6
        assert_logits_close(torch.stack(seen_b), torch.stack(seen_s))


def check_prefix_cache_exact(model_dir, block_size=4, chunk=16):
    """A greedy three-turn conversation with the prefix cache on equals the same with it off,
    logits and tokens: turn 2 appends to turn 1's prompt + answer (served from the tree, a
    partially matched block copied, a hybrid model resuming from its end-of-request
    checkpoint); turn 3 edits turn 1's answer (as agents strip thinking) and resumes from
    the end of turn 1's prompt. Prefill tokens are counted in the engine."""
    d = str(model_dir)
    opts = dict(dtype="float32", kv_block_size=block_size, max_num_batched_tokens=chunk)
    cached, cold = LLM(d, prefix_cache=True, **opts), LLM(d, prefix_cache=False, **opts)
    p1 = ids_for(29, seed=11)
    params = dict(max_tokens=7, temperature=0.0, ignore_eos=True)
    answers, served = {}, {}
    for name, llm in (("cached", cached), ("cold", cold)):
        turns, got, counts = [p1], [], []
        for t in range(3):
            seen, proc = _capture()
            out = llm.generate([turns[t]], SamplingParams(logits_processors=[proc], **params))[0]
            got.append((out.token_ids, torch.stack(seen)))
            counts.append(out.num_cached_tokens)
            if t == 0:
                turns.append(p1 + out.token_ids + ids_for(13, seed=12))
                edited = [(x + 1) % 500 for x in out.token_ids]          # turn 1's answer rewritten
                turns.append(p1 + edited + ids_for(9, seed=13))
        answers[name], served[name] = got, counts
    for (tok_c, lg_c), (tok_r, lg_r) in zip(answers["cached"], answers["cold"]):
        assert tok_c == tok_r
        assert_logits_close(lg_c, lg_r)
    assert served["cold"] == [0, 0, 0]
    assert served["cached"] == [0, len(p1) + 6, len(p1)], served["cached"]
    engine = cached.engine
    assert not engine.has_unfinished() and engine.blocks.available == engine.blocks.num_blocks - 1
    engine.prefix.check()


class Harness:
    """Drives the model through the real ModelRunner with hand-made sequences, so a test
    can share KV blocks and snapshot/restore states the way a prefix cache would."""

    def __init__(self, path, num_blocks=64, block_size=4):
        cfg = EngineConfig(model=str(path), dtype="float32")
        self.model, _ = load_model(cfg, resolve(cfg))
        self.bs = block_size
        self.blocks = BlockManager(num_blocks, block_size)
        self.runner = ModelRunner(self.model, num_blocks, block_size)
        self._n = 0

    def seq(self, ids):
        self._n += 1
        return Sequence(f"s{self._n}", ids, SamplingParams(), None, 0, want_prompt_logits=True)

    def feed(self, seq, n):
        self.blocks.allocate(seq, seq.num_computed + n)
        full = self.runner.run([(seq, n)])[1]
        seq.num_computed += n
        return full[0]


def check_snapshot_restore_equals_recompute(model_dir, n=29, p=12, block_size=4):
    """Sequence A runs 0..p and snapshots its state, then diverges. Sequence B shares A's KV
    blocks for 0..p (as a prefix cache would), restores the snapshot and runs p..n: its
    logits must equal running 0..n in one go."""
    assert p % block_size == 0
    h = Harness(model_dir, block_size=block_size)
    ids = ids_for(n, seed=7)
    whole = h.seq(ids)
    ref = h.feed(whole, n)

    a = h.seq(ids[:p] + ids_for(10, seed=8))
    h.feed(a, p)
    snap = a.state.snapshot()
    assert snap.nbytes == a.state.nbytes > 0 and snap.position == p
    h.feed(a, 3)                                   # A moves on: the snapshot must not follow
    h.feed(a, 1)

    b = h.seq(ids)
    b.block_table = list(a.block_table[: p // block_size])
    b.num_computed = p
    b.state = h.model.make_state()
    b.state.restore(snap)
    out = [h.feed(b, 5), h.feed(b, 1), h.feed(b, n - p - 6)]
    assert_logits_close(torch.cat(out), ref[p:])
    for name, part in b.state.parts.items():              # and the states themselves agree
        for key, t in vars(part).items():
            if isinstance(t, torch.Tensor):
                torch.testing.assert_close(t, getattr(whole.state.parts[name], key), atol=1e-5, rtol=1e-4)


def check_state_position_guard(model_dir):
    """A step that does not start where the state stopped is an error, never wrong logits."""
    import pytest

    h = Harness(model_dir)
    s = h.seq(ids_for(12))
    h.feed(s, 8)
    s.state.restore(s.state.snapshot())
    s.state.advance(-4)                            # state says 4, sequence says 8
    with pytest.raises(RuntimeError, match="position"):
        h.feed(s, 1)
