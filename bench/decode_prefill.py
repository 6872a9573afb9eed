"""Prefill and decode speed, FreeToken vs transformers, same checkpoint, same run.

    .venv/bin/python bench/decode_prefill.py [--threads 2] [--prompt 512] [--decode 128] [--rounds 3]

Batch 1, bf16, random-weight medium Qwen3-MoE (hidden 2048, 64 experts top-8, expert
intermediate 768). Prints tok/s for both engines and the ratios freetoken/transformers.

Same work both sides: every timed call gets a fresh random prompt (no shared prefix with any
other, the warm-up's included) and FreeToken runs with its prefix cache off, so each timed
prefill computes every token. Per round: prefill = a 1-token generate on one prompt; decode =
(n - 1) tokens / (a n-token generate on another prompt of the same length - that prefill time).
Both engines report the median over the same rounds."""
from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import fresh_prompts, median, medium_checkpoint, set_threads, timed  # noqa: E402


def rates(prompts, n_decode, prefill, generate):
    """(median prefill tok/s, median decode tok/s, the first round's generated tokens) over rounds
    of prompts [warm-up, (prefill prompt, generate prompt) per round], all fresh."""
    warm, rounds = prompts[0], prompts[1:]
    generate(warm[:32], 4)
    pre, dec, tokens = [], [], None
    for a, b in zip(rounds[0::2], rounds[1::2]):
        t_prefill, _ = timed(prefill, a)
        t_all, out = timed(generate, b, n_decode)
        pre.append(len(a) / t_prefill)
        dec.append((n_decode - 1) / (t_all - t_prefill))
        tokens = tokens if tokens is not None else out
    return median(pre), median(dec), tokens


def bench_freetoken(model_dir, prompts, n_decode, threads, backend, max_model_len=2048):
    from freetoken import LLM, SamplingParams
    llm = LLM(str(model_dir), dtype="bfloat16", num_threads=threads, moe_backend=backend,
              max_model_len=max_model_len, prefix_cache=False)
    greedy = dict(temperature=0.0, ignore_eos=True)

    def generate(p, n):
        return llm.generate([p], SamplingParams(max_tokens=n, **greedy))[0].token_ids
    p, d, tokens = rates(prompts, n_decode, lambda p: generate(p, 1), generate)
    used = llm.expert_stats().get("backend", backend)
    llm.close()
    return p, d, tokens, used


def bench_transformers(model_dir, prompts, n_decode):
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)

    def generate(p, n):
        ids = torch.tensor([p])
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        return out[0, len(p):].tolist()
    with torch.inference_mode():
        return rates(prompts, n_decode, lambda p: model(torch.tensor([p])), generate)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    set_threads(args.threads)
    d = medium_checkpoint()
    prompts = fresh_prompts(1 + 2 * args.rounds, args.prompt)
    ft_p, ft_d, ft_tokens, used = bench_freetoken(d, prompts, args.decode, args.threads, args.backend)
    gc.collect()
    tf_p, tf_d, tf_tokens = bench_transformers(d, prompts, args.decode)
    same = next((i for i, (a, b) in enumerate(zip(ft_tokens, tf_tokens)) if a != b), len(ft_tokens))
    print(f"model {d.name}, bf16, batch 1, {args.threads} threads, prompt {args.prompt}, decode {args.decode}, "
          f"freetoken moe backend {used}, median of {args.rounds} rounds, fresh prompts, no prefix cache")
    print(f"{'':12}{'prefill tok/s':>15}{'decode tok/s':>15}")
    print(f"{'freetoken':12}{ft_p:15.1f}{ft_d:15.2f}")
    print(f"{'transformers':12}{tf_p:15.1f}{tf_d:15.2f}")
    print(f"{'ratio':12}{ft_p / tf_p:14.2f}x{ft_d / tf_d:14.2f}x")
    print(f"greedy tokens identical for the first {same} of {len(ft_tokens)}")


if __name__ == "__main__":
    main()
