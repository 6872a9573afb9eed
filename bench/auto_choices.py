"""What `compute_dtype="auto"` buys: FreeToken with each compute dtype on the same medium bf16
Qwen3-MoE, side by side in alternating rounds, at several contexts.

    PYTHONPATH=. .venv/bin/python bench/auto_choices.py [--threads 2] [--prompt 512,4096]
                                                        [--dtypes auto,bfloat16,float32] [--rounds 2]

Prints the choices "auto" made here (kernels/choices.py), then prefill tok/s and decode tok/s
at each context for each dtype, and the ratios to the first one listed. On an AVX512-BF16 CPU
the old automatic choice was bf16 activations (the `bfloat16` column)."""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import medium_checkpoint  # noqa: E402
from vs_llamacpp import isa_line, run_freetoken  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", default="512,4096")
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--dtypes", default="auto,bfloat16,float32")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(isa_line(args.threads), flush=True)
    model = medium_checkpoint()
    dtypes = args.dtypes.split(",")
    g = torch.Generator().manual_seed(0)
    rows = []
    for plen in map(int, args.prompt.split(",")):
        prompt = [torch.randint(100, 8000, (plen,), generator=g).tolist()]
        res = {d: [] for d in dtypes}
        for r in range(args.rounds):
            for d in (dtypes if r % 2 == 0 else dtypes[::-1]):
                out = run_freetoken(model, prompt, args.threads, args.decode, compute_dtype=d)
                out.pop("llm").close()
                res[d].append(out)
        med = {d: (statistics.median(x["prefill"] for x in v), statistics.median(x["decode"] for x in v))
               for d, v in res.items()}
        rows.append((plen, med))
        base = med[dtypes[0]]
        for d in dtypes:
            p, dd = med[d]
            print(f"prompt {plen:6}  {d:9}  prefill {p:8.1f} tok/s ({p / base[0]:.2f}x)  "
                  f"decode {dd:7.2f} tok/s ({dd / base[1]:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
