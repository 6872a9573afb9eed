"""A GGUF's packed attention weights (`GgmlLinear`, the ggml GEMV) in the one-call attention
half (`ft_attn_half`, layers/attention/decode_half.py): greedy tokens and every logits row as the separate
calls give them, on a Q8_0 file llama.cpp's converter made."""
from __future__ import annotations

import torch

from freetoken import LLM, SamplingParams
from freetoken.experts.execution.decode_row import MoERow
from freetoken.layers.attention import decode_half as half_mod
from freetoken.layers.attention.decode_half import AttnHalf
from freetoken.layers.attention import decode_stack as stack_mod
from freetoken.layers.attention.decode_stack import DecodeStack
from freetoken.layers import moe as moe_mod
from freetoken.layers.ggml_linear import GgmlLinear


def _decode(llm: LLM, prompt: list[int]):
    model = llm.engine.model
    rows, orig = [], model.compute_logits
    model.compute_logits = lambda h: rows.append(orig(h).clone()) or rows[-1]
    try:
        out = llm.generate([prompt], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))
    finally:
        model.compute_logits = orig
    return out[0].token_ids, rows


def _one_call_is_the_separate_calls(llm: LLM, one_call, switch: list) -> None:
    """Decodes once watching `one_call`'s calls (a non-None result: it ran) and once with its
    `switch` off: the same greedy tokens and every logits row bit-identical."""
    ran, call = [], one_call.__call__
    one_call.__call__ = lambda self, *a: (lambda r: ran.append(r is not None) or r)(call(self, *a))
    try:
        fused = _decode(llm, [5, 6, 7, 8, 9])
    finally:
        one_call.__call__ = call
    assert any(ran), f"{one_call.__name__} never ran"
    switch[0] = False
    try:
        ref = _decode(llm, [5, 6, 7, 8, 9])
    finally:
        switch[0] = True
    assert fused[0] == ref[0]
    assert len(fused[1]) == len(ref[1]) and all(torch.equal(a, b) for a, b in zip(fused[1], ref[1]))


def test_ggml_attention_half_is_the_separate_calls(tiny_dir, to_gguf, stack_off):
    # (stack off: the layers one by one, each step through AttnHalf; with the stack, a prompt of
    # <= 16 builds the halves (a few rows' call) and the stack takes every step)
    llm = LLM(str(to_gguf(tiny_dir("qwen3_moe"), "q8_0")), moe_backend="cpu", num_threads=2, prefix_cache=False,
              speculative="off")
    try:
        assert isinstance(llm.engine.model.layers[0].attn.qkv, GgmlLinear)
        _one_call_is_the_separate_calls(llm, AttnHalf, half_mod.FUSED)
    finally:
        llm.close()


def test_ggml_moe_row_is_the_block_call(tiny_dir, to_gguf, stack_off):
    """The GGUF's packed experts (ggml banks) in a decode row's MoE call on reused rows
    (experts/execution/decode_row.py): the bits of the same call through the MoE block (layers one
    by one: the stack would take every step)."""
    llm = LLM(str(to_gguf(tiny_dir("qwen3_moe"), "q8_0")), moe_backend="cpu", num_threads=2, prefix_cache=False,
              speculative="off")
    try:
        _one_call_is_the_separate_calls(llm, MoERow, moe_mod.ROWS)
    finally:
        llm.close()


def test_ggml_layers_stack_is_the_layer_calls(tiny_dir, to_gguf):
    """The GGUF's packed attention weights and experts through every layer in one call
    (`ft_layers_row`, layers/attention/decode_stack.py): the bits of the layers called one by one."""
    llm = LLM(str(to_gguf(tiny_dir("qwen3_moe"), "q8_0")), moe_backend="cpu", num_threads=2, prefix_cache=False,
              speculative="off")
    try:
        _one_call_is_the_separate_calls(llm, DecodeStack, stack_mod.STACK)
    finally:
        llm.close()
