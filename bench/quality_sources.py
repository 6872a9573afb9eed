"""Where FreeToken and llama.cpp part numerically, by measurement (issue 35; outside CI):

    .venv/bin/python bench/quality_sources.py [--model FILE.gguf] [--chunks 4] [--cache DIR]

A float reference of the same GGUF (transformers' LlamaForCausalLM holding the weights
dequantized by `gguf.quants`, as tests/models/test_smollm2_gguf.py builds it) is run with each of
llama.cpp's CPU roundings emulated, alone and together, and each variant's next-token
distributions are scored against llama.cpp's own logits on the same chunks (bench/quality.py's
text and llama-perplexity windows): mean KL(llama.cpp || variant) and top-1 agreement. The
roundings (read from ggml-cpu's sources):
  - act-q8: every matmul's activation row quantized to int8 per 32 with an fp16 scale (the
    vec_dot_type q8_0 / q8_1 of the Q8_0 / Q4_1 weights) before the dot;
  - kv-f16: attention as llama.cpp's non-flash path with its default f16 cache: K and V stored
    in f16, Q converted to f16 for the K dot, the softmax probabilities to f16 for the V dot.
The variant that brings agreement up is the one worth building into the engine. llama.cpp's
logits are cached in --cache (the same chunks are re-scored without running it again)."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from quality import run_llama  # noqa: E402
from quality_text import stdlib_docstrings  # noqa: E402
from vs_llamacpp import isa_line  # noqa: E402

from freetoken.quality.perplexity import chunks, scored, text_tokens  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "models"))
from test_smollm2_gguf import llama_reference as reference  # noqa: E402  (the tests' float reference)


def q8_roundtrip(x: torch.Tensor) -> torch.Tensor:
    """x rounded as ggml's quantize_row_q8_0/q8_1: per 32, d = amax/127, q = round(x/d), the
    scale stored in fp16; returns q * fp16(d) (what the integer dot multiplies)."""
    shape = x.shape
    b = x.reshape(-1, shape[-1] // 32, 32).float()
    d = b.abs().amax(-1, keepdim=True) / 127
    q = torch.round(b * torch.where(d > 0, 1 / d, torch.zeros_like(d)))
    return (q * d.half().float()).reshape(shape)


def q8_1_sums(x: torch.Tensor) -> torch.Tensor:
    """Per block of 32: llama.cpp's fp16 block sum s = fp16(d * sum q) (d unrounded) minus the
    sum the dequantized activations carry (fp16(d) * sum q): what a Q4_1 / Q5_1 dot adds times
    the block's min beyond x_hat . w."""
    b = x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32).float()
    d = b.abs().amax(-1, keepdim=True) / 127
    sq = torch.round(b * torch.where(d > 0, 1 / d, torch.zeros_like(d))).sum(-1)
    d = d[..., 0]
    return (d * sq).half().float() - d.half().float() * sq


def block_mins(path: str) -> dict[str, torch.Tensor]:
    """HF Linear name -> [rows, blocks] fp32 mins m of its Q4_1 / Q5_1 blocks (the rows in HF order)."""
    import gguf
    r = gguf.GGUFReader(path)
    heads, kv = (r.fields[f"llama.attention.head_count{s}"].contents() for s in ("", "_kv"))
    part = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
            "ffn_down": "mlp.down_proj"}
    out = {}
    for t in r.tensors:
        kind = {gguf.GGMLQuantizationType.Q4_1: 20, gguf.GGMLQuantizationType.Q5_1: 24}.get(t.tensor_type)
        if kind is None or not t.name.startswith("blk."):
            continue
        _, i, p, _ = t.name.split(".")
        raw = np.asarray(t.data).reshape(-1, kind)
        m = torch.from_numpy(raw[:, 2:4].copy().view(np.float16).astype(np.float32)).reshape(int(t.shape[1]), -1)
        if p in ("attn_q", "attn_k"):
            n = heads if p == "attn_q" else kv
            m = m.reshape(n, m.shape[0] // n // 2, 2, m.shape[1]).swapaxes(1, 2).reshape(m.shape)
        out[f"model.layers.{i}.{part[p]}"] = m
    return out


def f16_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """llama.cpp's non-flash CPU attention with an f16 cache: K, V and Q in f16, dots in fp32,
    softmax in fp32, the probabilities rounded to f16 for the V product."""
    from transformers.models.llama.modeling_llama import repeat_kv
    h = lambda t: t.half().float()  # noqa: E731
    k, v = repeat_kv(h(key), module.num_key_value_groups), repeat_kv(h(value), module.num_key_value_groups)
    w = torch.matmul(h(query), k.transpose(2, 3)) * scaling
    n, m = w.shape[-2:]
    causal = torch.ones(n, m, dtype=torch.bool).tril(m - n)     # the mask handed over may be None (causal implied)
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        causal = causal & attention_mask
    w = w.masked_fill(~causal, float("-inf"))
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        w = w + attention_mask
    p = h(torch.softmax(w.float(), dim=-1))
    return torch.matmul(p, v).transpose(1, 2).contiguous(), p


def variant_logits(model, chunk: list[int], act_q8, kv_f16: bool) -> torch.Tensor:
    from transformers import AttentionInterface
    AttentionInterface.register("llama_cpp_f16", f16_attention)
    model.config._attn_implementation = "llama_cpp_f16" if kv_f16 else "eager"
    hooks = []
    if act_q8:
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.Linear):
                hooks.append(m.register_forward_pre_hook(lambda _m, a: (_m.__dict__.update(x=a[0]), q8_roundtrip(a[0]))[1:]))
                mins = act_q8.get(name) if isinstance(act_q8, dict) else None
                if mins is not None:    # q8_1's fp16 block sums times the weights' block mins
                    hooks.append(m.register_forward_hook(
                        lambda _m, a, y, mins=mins: y + q8_1_sums(_m.x) @ mins.T))
    try:
        with torch.no_grad():
            return model(torch.tensor([chunk])).logits[0].float()
    finally:
        for h in hooks:
            h.remove()


VARIANTS = (("fp32", False, False), ("kv-f16", False, True), ("act-q8", True, False),
            ("act-q8_1", "mins", False), ("act-q8_1 + kv-f16", "mins", True))


def llama_logits(model: str, windows: list[list[int]], cache: Path, threads: int, probe) -> list[np.ndarray]:
    cache.mkdir(parents=True, exist_ok=True)
    if not all((cache / f"chunk{i}.npy").exists() for i in range(len(windows))):
        run_llama(dict(model=model, ctx=len(windows[0]), threads=threads, chunks=windows, prompts=[], eos=[],
                       max_tokens=0, dir=str(cache), probe=probe[0], probe_ids=probe[1]))
    return [np.load(cache / f"chunk{i}.npy") for i in range(len(windows))]


def engine_row(model: str, numerics: str, windows, theirs, threads: int, step: int | None) -> None:
    """FreeToken itself (--dtype float32) under --ggml-numerics `numerics` against llama.cpp;
    `step` tokens per engine step (<= 64: the decode GEMV path instead of the prefill GEMM)."""
    from freetoken import LLM
    llm = LLM(model, dtype="float32", num_threads=threads, max_model_len=2048, prefix_cache=False,
              ggml_numerics=numerics, **({"max_num_batched_tokens": step} if step else {}))
    t, kls, top1 = time.perf_counter(), [], []
    for chunk, ll in zip(windows, theirs):
        lp, _ = scored(llm.score(chunk), chunk)
        lq = torch.log_softmax(torch.from_numpy(ll).double(), -1)
        kls.append((lq.exp() * (lq - lp)).sum(-1))
        top1.append((lq.argmax(-1) == lp.argmax(-1)).double())
    llm.close()
    kl, agree = torch.cat(kls), torch.cat(top1)
    print(f"{'engine-' + numerics + (f' step {step}' if step else ''):16s} KL(llama||variant) {kl.mean().item():.6f}  top-1 {agree.mean().item() * 100:.2f}% "
          f"of {agree.numel()}  ({time.perf_counter() - t:.0f} s)", flush=True)


def main() -> int:
    from freetoken.default_model import installed_default
    from freetoken.tokenizer import Tokenizer
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default=None, help="comma-separated variants of: engine-q8, engine-llama, engine-float32 "
                    "(FreeToken itself under --ggml-numerics), " + ", ".join(v[0] for v in VARIANTS))
    ap.add_argument("--step-tokens", type=int, default=None, help="FreeToken's tokens per engine step "
                    "(<= 64: score through the decode GEMV, as greedy answers run)")
    ap.add_argument("--cache", default="/tmp/ft_quality_sources", help="llama.cpp's logits per chunk")
    args = ap.parse_args()
    model = args.model or str(installed_default() or "")
    print(isa_line(args.threads))
    tok = Tokenizer(model)
    tokens, bos = text_tokens(tok, stdlib_docstrings())
    windows = list(chunks(tokens, args.ctx, bos, args.chunks))
    probe = "Hello world, this is 123 tokens' check."
    theirs = llama_logits(model, windows, Path(args.cache) / f"{Path(model).stem}-{args.ctx}", args.threads,
                          (probe, tok.encode(probe)))
    torch.set_num_threads(args.threads)
    ref = reference(model)
    base = []
    for numerics in [n for n in ("q8", "llama", "float32") if args.only is None or f"engine-{n}" in args.only.split(",")]:
        engine_row(model, numerics, windows, theirs, args.threads, args.step_tokens)
    mins = block_mins(model)
    for name, aq, kv in [v for v in VARIANTS if args.only is None or v[0] in args.only.split(",")]:
        aq = mins if aq == "mins" else aq
        t, kls, top1, self_kl = time.perf_counter(), [], [], []
        for i, (chunk, ll) in enumerate(zip(windows, theirs)):
            lp, _ = scored(variant_logits(ref, chunk, aq, kv), chunk)
            lq = torch.log_softmax(torch.from_numpy(ll).double(), -1)
            kls.append((lq.exp() * (lq - lp)).sum(-1))
            top1.append((lq.argmax(-1) == lp.argmax(-1)).double())
            if len(base) < len(windows):
                base.append(lp)
            self_kl.append((base[i].exp() * (base[i] - lp)).sum(-1))
        kl, agree = torch.cat(kls), torch.cat(top1)
        print(f"{name:16s} KL(llama||variant) {kl.mean().item():.6f}  top-1 {agree.mean().item() * 100:.2f}% "
              f"of {agree.numel()}   KL(fp32||variant) {torch.cat(self_kl).mean().item():.6f}  "
              f"({time.perf_counter() - t:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
