"""A one-row decode step through every decoder layer in one C call (`ft_layers_row`,
layers/attention/decode_stack.py): greedy tokens, every logits row and the expert counters (per
layer and per expert) bit for bit those of the layers called one by one (`ft_attn_half` then
`ft_moe_row` a layer, each from Python, then the final norm); the last layer's output row
outlives its step, the others are reused; a layer that must not take the row calls (a routing
hook) sends the whole step back to the per-layer path. gpt-oss (sinks, sliding-window layers'
keys in the sequence's ring past the window, router bias, MXFP4 experts with biases and the
clamped SwiGLU) on every kernel build this CPU runs."""
from __future__ import annotations

import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.layers.attention import decode_stack as stack_mod
from freetoken.kernels import variants_here
from freetoken.layers.attention.decode_stack import DecodeStack
from freetoken.tiny import make_tiny


def _run(llm: LLM, prompts: list[list[int]], tokens: int):
    """(tokens of each prompt, every logits row, the expert counters, each step's last hidden row)."""
    model = llm.engine.model
    model.experts.stats_.reset()
    rows, kept, orig, forward = [], [], model.compute_logits, model.forward
    model.compute_logits = lambda h: rows.append(orig(h).clone()) or rows[-1]

    def spy(*a):
        h = forward(*a)
        kept.append((model.prenorm, model.prenorm.clone()))
        return h
    model.forward = spy
    try:
        out = llm.generate(prompts, SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True))
    finally:
        model.compute_logits, model.forward = orig, forward
    return [o.token_ids for o in out], rows, model.experts.stats(), kept


def _same(a, b):
    assert a[0] == b[0]
    assert len(a[1]) == len(b[1]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))
    assert a[2]["per_expert"] == b[2]["per_expert"]
    for x, y in zip(a[2]["per_layer"], b[2]["per_layer"]):
        assert {k: v for k, v in x.items() if not k.endswith("_s")} == {k: v for k, v in y.items() if not k.endswith("_s")}
    for kept in (a[3], b[3]):               # each step's last rows as they were (an MTP drafter's input)
        assert all(torch.equal(p, c) for p, c in kept)


def _stack_is_the_layer_calls(llm: LLM, steps: int = 10) -> int:
    """Runs one row and then two rows (never stacked) with the stack on and off; returns the
    steps the stack ran."""
    ran, call = [], DecodeStack.__call__
    DecodeStack.__call__ = lambda self, *a: (lambda r: ran.append(r) or r)(call(self, *a))
    try:
        for prompts in ([[5, 6, 7, 8, 9]], [[5, 6, 7, 8, 9], [11, 12]]):
            on = _run(llm, prompts, steps)
            stack_mod.STACK[0] = False
            try:
                off = _run(llm, prompts, steps)
            finally:
                stack_mod.STACK[0] = True
            _same(on, off)
    finally:
        DecodeStack.__call__ = call
    outs = [r for r in ran if r is not None]
    assert len({r[0].data_ptr() for r in outs}) == len(outs)      # the last layer: a new row each step
    assert all(r[1] is not None for r in outs)                    # the final norm: in the same call
    return len(outs)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_stack_is_the_layer_calls(tmp_path, arch, dtype):
    path = make_tiny(arch, tmp_path / arch, layers=3, hidden=64, experts=8, top_k=2, vocab=512)
    llm = LLM(str(path), dtype=dtype, moe_backend="cpu", num_threads=2, prefix_cache=False, speculative="off")
    try:
        # every one-row step but the first (it builds the layers' calls); the two-row steps never
        assert _stack_is_the_layer_calls(llm) >= 8
        model = llm.engine.model
        interior = {id(layer.half.moe.out) for layer in model.layers[:-1]}
        assert len(interior) == len(model.layers) - 1           # interior rows: built once, reused
    finally:
        llm.close()


@pytest.mark.parametrize("isa", variants_here())
@pytest.mark.parametrize("arch", ["gpt_oss", "gpt_oss_mxfp4"])
def test_gpt_oss_stack_is_the_layer_calls(tmp_path, arch, isa):
    """gpt-oss's full and sliding-window layers alternate (window 8: 5 prompt tokens and 14 steps
    wrap the ring); the native build's pool takes the stack, the other builds keep the layers'
    separate calls (no one-call half: `AttnHalf.build`), each bit-equal with the stack off."""
    path = make_tiny(arch, tmp_path / arch, layers=3, hidden=64, experts=8, top_k=2, vocab=512)
    llm = LLM(str(path), dtype="bfloat16", moe_backend="cpu", num_threads=2, prefix_cache=False, speculative="off",
              kernel_isa=isa)
    try:
        model = llm.engine.model
        assert [layer.slot for layer in model.layers] == [0, None, 1]
        ran = _stack_is_the_layer_calls(llm, steps=14)
        assert ran >= 12 if isa == "native" else ran == 0
    finally:
        llm.close()


def test_a_routing_hook_takes_the_layers_one_by_one(tmp_path):
    """A layer whose routes a hook watches (`SparseMoE.on_route`) cannot take its row call: the
    step runs every layer from Python, the hook sees every step's routes."""
    path = make_tiny("qwen3_moe", tmp_path / "m", layers=3, hidden=64, experts=8, top_k=2, vocab=512)
    llm = LLM(str(path), dtype="float32", moe_backend="cpu", num_threads=2, prefix_cache=False, speculative="off")
    try:
        ref = _run(llm, [[5, 6, 7, 8, 9]], 8)
        mlp = llm.engine.model.layers[1].mlp
        seen = []
        mlp.on_route = lambda layer, ids, w: seen.append(ids.shape[0])
        ran, call = [], DecodeStack.__call__
        DecodeStack.__call__ = lambda self, *a: (lambda r: ran.append(r) or r)(call(self, *a))
        try:
            hooked = _run(llm, [[5, 6, 7, 8, 9]], 8)
        finally:
            DecodeStack.__call__ = call
            mlp.on_route = None
        assert ran and all(r is None for r in ran)
        assert len(seen) == 8           # the prefill's routes, then each of 7 decode steps'
        _same(hooked, ref)
    finally:
        llm.close()
