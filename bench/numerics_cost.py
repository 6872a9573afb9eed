"""What a `--ggml-numerics` choice costs in speed, against the default, same process (outside CI):

    .venv/bin/python bench/numerics_cost.py [--model smollm2] [--numerics llama-exact] [--prompt 128]
                                            [--decode 32] [--rounds 3] [--threads 2]

Two engines on the same GGUF (`--dtype float32`, prefix cache off): `auto` and --numerics.
Rounds alternate between them (so a shared machine's load falls on both alike); per round,
one greedy request over --prompt tokens of bench/quality_text.py's text (a fresh slice each
round): prefill = prompt tokens / time to the first token, decode = the --decode - 1 tokens after
it / their time.
Prints each engine's median tok/s and the ratio mode / auto."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from quality_text import stdlib_docstrings  # noqa: E402
from real_models import resolve  # noqa: E402


def timed_round(llm, ids: list[int], decode: int) -> tuple[float, float]:
    """(prefill tok/s: prompt to first token, decode tok/s: the tokens after it) of one greedy request."""
    from freetoken import SamplingParams
    engine, n, first = llm.engine, 0, None
    t0 = time.perf_counter()
    engine.add_request(f"cost{time.perf_counter_ns()}", list(ids),
                       SamplingParams(max_tokens=decode, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished():
        for out in engine.step():
            n += len(out.new_token_ids)
            if first is None and n:
                first = time.perf_counter()
    end = time.perf_counter()
    return len(ids) / (first - t0), (n - 1) / max(end - first, 1e-9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--numerics", default="llama-exact", choices=("q8", "llama", "llama-exact", "float32"))
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from freetoken import LLM
    model = resolve(args.model)
    engines = {m: LLM(str(model), dtype="float32", num_threads=args.threads, prefix_cache=False, ggml_numerics=m,
                      max_model_len=max(1024, args.prompt + args.decode + 8)) for m in ("auto", args.numerics)}
    text = engines["auto"].tokenizer.encode(stdlib_docstrings()[:40 * args.prompt * (args.rounds + 1)])
    for llm in engines.values():          # warm-up: kernels built, first-call costs paid
        timed_round(llm, text[:32], 4)
    got = {m: [] for m in engines}
    for r in range(args.rounds):
        ids = text[args.prompt * r:args.prompt * (r + 1)]
        for m, llm in engines.items():
            got[m].append(timed_round(llm, ids, args.decode))
    med = {m: (statistics.median(p for p, _ in v), statistics.median(d for _, d in v)) for m, v in got.items()}
    print(f"model {model}; {args.prompt}-token prompts, {args.decode} decoded, {args.rounds} alternating rounds, "
          f"{args.threads} threads, --dtype float32")
    for m, (p, d) in med.items():
        print(f"--ggml-numerics {m:<12} prefill {p:8.1f} tok/s   decode {d:7.2f} tok/s")
    (pa, da), (pm, dm) = med["auto"], med[args.numerics]
    print(f"{args.numerics} / auto        prefill {pm / pa:8.3f}x        decode {dm / da:7.3f}x")
    for llm in engines.values():
        llm.close()


if __name__ == "__main__":
    main()
