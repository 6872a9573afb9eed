"""KDA (GLM-5.3-Flash linear attention) prefill and decode: our chunked/recurrent rules
(`layers/kda.py`) next to transformers' torch reference, measured side by side in one run.

Usage: python bench/kda_prefill.py [--heads 16] [--dim 128] [--tokens 2048]
Prints per-rule times and the ratio ours / transformers (lower is better)."""
from __future__ import annotations

import argparse
import time

import torch
from transformers.models.glm5_next import modeling_glm5_next as ref

from freetoken.layers.kda import chunk_kda, recurrent_kda


def best(fn, reps=3):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    shape = (1, a.tokens, a.heads, a.dim)
    q, k, v = (torch.randn(shape, generator=g) for _ in range(3))
    gate = -5 * torch.sigmoid(torch.randn(shape, generator=g))
    beta = torch.sigmoid(torch.randn(shape[:3], generator=g))
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    with torch.inference_mode():
        ours = best(lambda: chunk_kda(q, k, v, gate, beta))
        theirs = best(lambda: ref.chunk_kimi_delta_attention(q, k, v, gate, beta, **kw))
        print(f"prefill {a.tokens} tokens, {a.heads} heads x {a.dim}: ours {ours * 1e3:.1f} ms, "
              f"transformers {theirs * 1e3:.1f} ms, ratio {ours / theirs:.2f}")
        s = torch.zeros(1, a.heads, a.dim, a.dim)
        one = [x[:, :1] for x in (q, k, v, gate, beta)]
        ours = best(lambda: [recurrent_kda(*one, s) for _ in range(50)]) / 50
        theirs = best(lambda: [ref.recurrent_kimi_delta_attention(*one, initial_state=s, **kw) for _ in range(50)]) / 50
        print(f"decode step: ours {ours * 1e6:.0f} us, transformers {theirs * 1e6:.0f} us, ratio {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
