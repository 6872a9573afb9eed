"""A GGUF that llama.cpp's converter made from a GLM-4.5-layout checkpoint with a nextn layer
keeps it (`blk.N.nextn.*` and the block's own attention and experts): the decoder's expert pool
leaves that block out, and `--speculative mtp` drafts from it exactly as from the Hugging Face
checkpoint (f32 GGUF: the same weights), with greedy output unchanged."""
from __future__ import annotations

import torch

from freetoken import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


def test_gguf_nextn_layer_drafts_as_the_hf_checkpoint(tiny_dir, to_gguf):
    from freetoken.engine.spec.mtp import MTPDrafter, _SeqState
    hf_dir = tiny_dir("glm4_moe", nextn=1)
    gguf = to_gguf(hf_dir)
    ids = list(range(40, 63))
    logits = {}
    for name, path in (("hf", hf_dir), ("gguf", gguf)):
        llm = LLM(str(path), dtype="float32", speculative="mtp")
        model = llm.engine.runner.model
        assert model.pool.num_layers == len(model.moe_layers)      # the nextn block's experts are its own
        llm.score(ids)
        out = MTPDrafter(model.mtp)._rows(_SeqState(), model.prenorm[:-1], ids[1:], 0)
        logits[name] = model.mtp.logits(out)
    assert torch.allclose(logits["gguf"], logits["hf"], atol=1e-4, rtol=1e-4)
    prompts = [list(range(7, 19))]
    plain = LLM(str(gguf), dtype="float32", speculative="off").generate(prompts, GREEDY)[0].token_ids
    llm = LLM(str(gguf), dtype="float32", speculative="mtp", spec_max_draft=3)
    llm.engine.spec.priced = False
    assert llm.generate(prompts, GREEDY)[0].token_ids == plain
    assert llm.engine.spec.stats.summary()["mtp"]["drafts"] > 3
