"""Agents edit old history: a hybrid model resumes from the semantic-anchor checkpoint just
before the edited block (not from the start, not from the end of the last prompt), and its
answer is the one computed from scratch."""
import torch

from freetoken import LLM, SamplingParams

from helpers import assert_logits_close

TOOL = {"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}


def _history(tool_output: str, thinking: str | None):
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"cmd": "ls -la"}}}
    assistant = {"role": "assistant", "content": "", "tool_calls": [call]}
    if thinking:
        assistant["reasoning_content"] = thinking
    return [{"role": "system", "content": "You are a coding agent. Work step by step. " * 8},
            {"role": "user", "content": "Find the failing test and fix it."},
            assistant,
            {"role": "tool", "tool_call_id": "c1", "content": tool_output},
            {"role": "assistant", "content": "The tests are in tests/. Running them now."},
            {"role": "user", "content": "Go on."}]


def _common(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _run(llm, ids):
    seen = []

    def proc(_, logits):
        seen.append(logits.clone())
        return logits
    out = llm.generate([ids], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True,
                                             logits_processors=[proc]))[0]
    return out, torch.stack(seen)


def test_hybrid_resumes_before_a_replaced_tool_output(tiny_dir):
    d = str(tiny_dir("qwen3_5_moe", initializer_range=0.2))
    cached = LLM(d, dtype="float32", kv_block_size=8, max_num_batched_tokens=64)
    cold = LLM(d, dtype="float32", kv_block_size=8, prefix_cache=False)
    tok = cached.tokenizer
    listing = "\n".join(f"-rw-r--r-- 1 dev dev {i * 37} file_{i}.py" for i in range(40))
    first = tok.encode(tok.apply_chat_template(_history(listing, "I should list the files."), tools=[TOOL]))
    edited = tok.encode(tok.apply_chat_template(_history("[old tool output pruned]", None), tools=[TOOL]))
    _run(cached, first)
    out, logits = _run(cached, edited)
    ref, ref_logits = _run(cold, edited)
    assert out.token_ids == ref.token_ids
    assert_logits_close(logits, ref_logits)

    diverge = _common(first, edited)
    anchors = cached.engine.prefix.policy.anchors.positions(first[:len(first)])
    expected = max(p for p in anchors if p <= diverge)
    assert 0 < expected <= out.num_cached_tokens <= diverge
    assert diverge - out.num_cached_tokens < 16          # only the edited block's opening is recomputed
