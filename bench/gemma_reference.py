"""FreeToken against the float model on Gemma 3 270M Q4_K_M (outside CI; issue 35):

    .venv/bin/python bench/gemma_reference.py [--ctx 1024] [--chunks 1] [--threads 2]

bench/quality.py's chunks scored by FreeToken (`LLM.score`, --dtype float32, default numerics)
and by tests/models/test_gemma3_gguf.py's reference (transformers' Gemma3ForCausalLM holding the
file's weights dequantized by `gguf.quants`): mean / max KL(reference || FreeToken) and top-1
agreement at the scored positions. Says whether a gap to llama.cpp (bench/quality.py --model
gemma3-270m) is FreeToken's or llama.cpp's."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "models"))
from quality_text import stdlib_docstrings  # noqa: E402
from real_models import resolve  # noqa: E402
from test_gemma3_gguf import gemma3_reference  # noqa: E402  (the test's float reference)

from freetoken.quality.perplexity import chunks, scored, text_tokens  # noqa: E402


def main() -> int:
    from freetoken import LLM
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--chunks", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = resolve("gemma3-270m")
    llm = LLM(str(model), dtype="float32", num_threads=args.threads, max_model_len=max(2048, args.ctx),
              prefix_cache=False)
    tokens, bos = text_tokens(llm.tokenizer, stdlib_docstrings())
    windows = list(chunks(tokens, args.ctx, bos, args.chunks))
    ours = [scored(llm.score(c), c)[0] for c in windows]
    llm.close()
    ref = gemma3_reference(model)
    kls, top1 = [], []
    for chunk, lp in zip(windows, ours):
        with torch.no_grad():
            lq, _ = scored(ref(torch.tensor([chunk])).logits[0].float(), chunk)
        kls.append((lq.exp() * (lq - lp)).sum(-1))
        top1.append((lq.argmax(-1) == lp.argmax(-1)).double())
    kl, agree = torch.cat(kls), torch.cat(top1)
    print(f"KL(float reference || FreeToken) mean {kl.mean().item():.3g} max {kl.max().item():.3g}; "
          f"top-1 {agree.mean().item() * 100:.2f}% of {agree.numel()} ({len(windows)} chunks of {args.ctx})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
