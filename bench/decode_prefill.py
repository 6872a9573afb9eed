"""Prefill and decode speed, FreeToken vs transformers, same checkpoint, same run.

    .venv/bin/python bench/decode_prefill.py [--threads 2] [--prompt 512] [--decode 128]

Batch 1, bf16, random-weight medium Qwen3-MoE (hidden 2048, 64 experts top-8, expert
intermediate 768). Prints tok/s for both engines and the ratios freetoken/transformers."""
from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import medium_checkpoint, set_threads, timed  # noqa: E402


def bench_freetoken(model_dir, prompt, n_decode, threads, backend):
    from freetoken import LLM, SamplingParams
    llm = LLM(str(model_dir), dtype="bfloat16", num_threads=threads, moe_backend=backend, max_model_len=2048)
    greedy = dict(temperature=0.0, ignore_eos=True)
    llm.generate([prompt[:32]], SamplingParams(max_tokens=4, **greedy))                # warm-up
    t_prefill, _ = timed(llm.generate, [prompt], SamplingParams(max_tokens=1, **greedy))
    t_all, out = timed(llm.generate, [prompt], SamplingParams(max_tokens=n_decode, **greedy))
    used = llm.expert_stats().get("backend", backend)
    llm.close()
    return len(prompt) / t_prefill, (n_decode - 1) / (t_all - t_prefill), out[0].token_ids, used


def bench_transformers(model_dir, prompt, n_decode):
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        model(ids[:, :32])                                                               # warm-up
        t_prefill, _ = timed(model, ids)
        t_all, out = timed(model.generate, ids, max_new_tokens=n_decode, min_new_tokens=n_decode,
                           do_sample=False, pad_token_id=0)
    return len(prompt) / t_prefill, (n_decode - 1) / (t_all - t_prefill), out[0, len(prompt):].tolist()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--backend", default="auto")
    args = ap.parse_args()
    set_threads(args.threads)
    d = medium_checkpoint()
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 8000, (args.prompt,), generator=g).tolist()
    ft_p, ft_d, ft_tokens, used = bench_freetoken(d, prompt, args.decode, args.threads, args.backend)
    gc.collect()
    tf_p, tf_d, tf_tokens = bench_transformers(d, prompt, args.decode)
    same = next((i for i, (a, b) in enumerate(zip(ft_tokens, tf_tokens)) if a != b), len(ft_tokens))
    print(f"model {d.name}, bf16, batch 1, {args.threads} threads, prompt {args.prompt}, decode {args.decode}, "
          f"freetoken moe backend {used}")
    print(f"{'':12}{'prefill tok/s':>15}{'decode tok/s':>15}")
    print(f"{'freetoken':12}{ft_p:15.1f}{ft_d:15.2f}")
    print(f"{'transformers':12}{tf_p:15.1f}{tf_d:15.2f}")
    print(f"{'ratio':12}{ft_p / tf_p:14.2f}x{ft_d / tf_d:14.2f}x")
    print(f"greedy tokens identical for the first {same} of {len(ft_tokens)}")


if __name__ == "__main__":
    main()
