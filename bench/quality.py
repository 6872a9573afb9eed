"""FreeToken vs llama.cpp on the same GGUF and the same real text (outside CI):

    .venv/bin/python bench/quality.py [--model FILE.gguf|smollm2|gemma3-270m] [--ctx 512] [--chunks 8]
                                      [--prompts 20] [--max-tokens 64] [--threads 2] [--dtype float32]
                                      [--ggml-numerics auto|q8|llama|llama-exact|float32]
                                      [--formats own,q8_0,q4_0,q4_k_m,q6_k,...] [--cache DIR]

The model defaults to the installed SmolLM2-135M-Instruct (Q4_1); gemma3-270m is Gemma 3 270M
Q4_K_M from its four PyPI part packages (bench/real_models.py says how to install either). The
text is bench/quality_text.py's (CPython's standard-library docstrings, named in the output).
--formats runs the whole comparison once per file: `own` is the model's own GGUF, every other
name a quantizer mix of llama.cpp (bench/llamacpp_quantize.py: q8_0, q6_k, q5_0, q5_1, q4_0,
q4_1, q4_k_m, q3_k_m, q2_k, iq4_nl, iq4_xs and the lattice i-quants with a uniform importance
matrix) that `llama_model_quantize` makes from the own GGUF with allow_requantize (each tensor
dequantized, then quantized again: a requantized file, not one quantized from the original
float weights), cached in --cache; a table of every format closes the run. Measured,
with llama-perplexity's method (freetoken/quality/perplexity.py: n_ctx chunks, first half of each
unscored) on the very same tokens in both engines:
  - perplexity of each engine, and their ratio;
  - mean KL(llama.cpp || FreeToken) of the next-token distributions at every scored position;
  - top-1 agreement (the two argmaxes equal) at those positions;
  - greedy answers to PROMPTS (the GGUF's chat template, --max-tokens): how many are token-for-token identical;
  - prefill tok/s (each chunk's forward) and decode tok/s (the greedy answers' steps after the first token), and FreeToken/llama.cpp.
llama.cpp runs in a child process (llama-cpp-python, its AMX permission refused as in
vs_llamacpp.py) and hands back each chunk's logits. Targets (issue 35): ppl within 0.5%,
mean KL <= 0.005, top-1 >= 98% over >= 2,000 positions, >= 18/20 greedy answers identical."""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import CACHE  # noqa: E402
from llamacpp_quantize import quantize, type_mix  # noqa: E402
from quality_text import name as text_name, stdlib_docstrings  # noqa: E402
from real_models import resolve  # noqa: E402
from vs_llamacpp import NO_AMX, isa_line  # noqa: E402

from freetoken.quality.perplexity import Perplexity, chunks, nll, scored, text_tokens  # noqa: E402

PROMPTS = [
    "Write a Python function that returns the sum of a list.",
    "What is the capital of France?",
    "Explain what a hash table is in two sentences.",
    "Write a haiku about the sea.",
    "List three primary colors.",
    "How many days are in a leap year?",
    "Translate 'good morning' into Spanish.",
    "Write a Python function that reverses a string.",
    "What does HTTP stand for?",
    "Give me a tip for sleeping better.",
    "What is 12 times 12?",
    "Name a mammal that can fly.",
    "Write a SQL query that counts the rows of a table named users.",
    "What is the boiling point of water in Celsius?",
    "Summarize the plot of Romeo and Juliet in one sentence.",
    "Write a shell command that lists the files in a directory.",
    "Why is the sky blue?",
    "Suggest a name for a pet goldfish.",
    "What is the difference between a list and a tuple in Python?",
    "Write a short thank-you note to a teacher.",
]

LLAMA_CHILD = NO_AMX + """
import json, sys, time
import numpy as np
import llama_cpp as L
job = json.loads(open(sys.argv[1]).read())
llm = L.Llama(job["model"], n_ctx=max(job["ctx"], 1024), n_batch=job["ctx"], n_ubatch=job["ctx"], logits_all=True,
              n_threads=job["threads"], n_threads_batch=job["threads"], verbose=False)
out = {"prefill_s": [], "answers": [], "decode": []}
assert llm.tokenize(job["probe"].encode(), add_bos=False, special=False) == job["probe_ids"], "tokenizers differ"
for i, chunk in enumerate(job["chunks"]):
    llm.reset()
    t = time.perf_counter()
    llm.eval(chunk)
    out["prefill_s"].append(time.perf_counter() - t)
    np.save(f"{job['dir']}/chunk{i}.npy", np.asarray(llm.scores[len(chunk) // 2:len(chunk) - 1], dtype=np.float32))
eos = set(job["eos"])
for p in job["prompts"]:
    llm.reset()
    llm.eval(p)
    toks, t = [], time.perf_counter()
    for step in range(job["max_tokens"]):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        if step == 1:
            t = time.perf_counter()
        toks.append(nxt)
        if nxt in eos:
            break
        llm.eval([nxt])
    if len(toks) > 2:
        out["decode"].append((len(toks) - 2, time.perf_counter() - t))
    out["answers"].append(toks)
print(json.dumps(out))
"""


def run_llama(job: dict) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    p = subprocess.run([sys.executable, "-c", LLAMA_CHILD, f.name], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"llama.cpp child failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def freetoken_greedy(llm, prompt: list[int], max_tokens: int, eos: set[int]):
    """Greedy tokens (the eos included, as llama.cpp's loop keeps it) and (steps, seconds) after the first token."""
    from freetoken import SamplingParams
    engine = llm.engine
    engine.add_request(f"q{time.perf_counter_ns()}", list(prompt), SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, stop_token_ids=sorted(eos)))
    toks, t = [], None
    while engine.has_unfinished():
        for out in engine.step():
            toks.extend(out.new_token_ids)
            if t is None and toks:
                t0, t = time.perf_counter(), 0.0
    t = time.perf_counter() - t0 if toks else 0.0
    cut = next((i + 1 for i, x in enumerate(toks) if x in eos), len(toks))
    return toks[:cut], (max(len(toks) - 1, 0), t)


def chat_prompts(tok, n: int) -> list[list[int]]:
    """The first n PROMPTS as the GGUF's chat template renders them; without a template (a base
    model), the question alone after BOS where the vocabulary adds one."""
    if not tok.chat_template:
        return [tok.encode(q, add_special_tokens=True) for q in PROMPTS[:n]]
    return [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}])) for q in PROMPTS[:n]]


def compare(model: Path, args) -> dict:
    """One GGUF in both engines on the same chunks and prompts: the figures print_run prints."""
    from freetoken import LLM
    llm = LLM(str(model), dtype=args.dtype, num_threads=args.threads, max_model_len=max(2048, args.ctx),
              prefix_cache=False, prefill_gemm=args.prefill_gemm, ggml_numerics=args.ggml_numerics)
    tok = llm.tokenizer
    tokens, bos = text_tokens(tok, stdlib_docstrings())
    windows = list(chunks(tokens, args.ctx, bos, args.chunks))
    prompts = chat_prompts(tok, args.prompts)
    eos = sorted(tok.eos_token_ids)
    probe = "Hello world, this is 123 tokens' check."
    with tempfile.TemporaryDirectory() as d:
        theirs = run_llama(dict(model=str(model), ctx=args.ctx, threads=args.threads, chunks=windows, prompts=prompts,
                                eos=eos, max_tokens=args.max_tokens, dir=d, probe=probe,
                                probe_ids=tok.encode(probe)))
        ppl_ft, ppl_ll, kls, top1, pre_ft = Perplexity(), Perplexity(), [], [], []
        for i, chunk in enumerate(windows):
            t = time.perf_counter()
            logits = llm.score(chunk)
            pre_ft.append(time.perf_counter() - t)
            lp_ft, target = scored(logits, chunk)
            lp_ll = torch.log_softmax(torch.from_numpy(np.load(f"{d}/chunk{i}.npy")).double(), dim=-1)
            ppl_ft.add(nll(lp_ft, target))
            ppl_ll.add(nll(lp_ll, target))
            kls.append((lp_ll.exp() * (lp_ll - lp_ft)).sum(-1))
            top1.append(lp_ll.argmax(-1) == lp_ft.argmax(-1))
    ours, dec_ft = [], []
    for p in prompts:
        a, d = freetoken_greedy(llm, p, args.max_tokens, set(eos))
        ours.append(a)
        if d[0] > 1:
            dec_ft.append(d)
    llm.close()
    rate = lambda ds: sum(n for n, _ in ds) / sum(s for _, s in ds) if ds else float("nan")  # noqa: E731
    median = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    return dict(windows=len(windows), ppl_ft=ppl_ft, ppl_ll=ppl_ll, kl=torch.cat(kls) if kls else torch.zeros(0),
                agree=torch.cat(top1).double() if top1 else torch.zeros(0), prompts=len(prompts),
                same=sum(a == b for a, b in zip(ours, theirs["answers"])),
                differs=[(q, tok.decode(a), tok.decode(b), next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                                                                min(len(a), len(b))))
                         for q, a, b in zip(PROMPTS, ours, theirs["answers"]) if a != b],
                pf_ft=median([args.ctx / s for s in pre_ft]), pf_ll=median([args.ctx / s for s in theirs["prefill_s"]]),
                dc_ft=rate(dec_ft), dc_ll=rate(theirs["decode"]))


def print_run(r: dict, args) -> None:
    kl, agree = r["kl"], r["agree"]
    if r["windows"]:
        print(f"positions scored      {kl.numel()} ({r['windows']} chunks of {args.ctx}, FreeToken --dtype {args.dtype}, "
              f"prefill GEMM {args.prefill_gemm}, ggml numerics {args.ggml_numerics})")
        print(f"perplexity            FreeToken {r['ppl_ft'].ppl:.4f} +/- {r['ppl_ft'].err:.4f}   llama.cpp "
              f"{r['ppl_ll'].ppl:.4f} +/- {r['ppl_ll'].err:.4f}   ratio {r['ppl_ft'].ppl / r['ppl_ll'].ppl:.5f}  "
              f"(target within 0.5%)")
        print(f"mean KL(llama||ours)  {kl.mean().item():.6f}   p99 {kl.quantile(0.99).item():.5f}   "
              f"max {kl.max().item():.4f}  (target <= 0.005)")
        print(f"top-1 agreement       {agree.mean().item() * 100:.2f}%  (target >= 98%)")
    if r["prompts"]:
        print(f"greedy answers        {r['same']}/{r['prompts']} identical over up to {args.max_tokens} tokens  "
              f"(target >= 18/20)")
    for q, a, b, k in r["differs"]:
        print(f"  differs at token {k}: {q!r}\n    ours  {a[:160]!r}\n    llama {b[:160]!r}")
    if r["windows"]:
        print(f"prefill tok/s ({args.ctx})   FreeToken {r['pf_ft']:.0f}   llama.cpp {r['pf_ll']:.0f}   "
              f"ratio {r['pf_ft'] / r['pf_ll']:.2f}x")
    if r["prompts"]:
        print(f"decode tok/s          FreeToken {r['dc_ft']:.1f}   llama.cpp {r['dc_ll']:.1f}   "
              f"ratio {r['dc_ft'] / r['dc_ll']:.2f}x", flush=True)


def format_file(model: Path, fmt: str, cache: Path) -> Path:
    """The GGUF of a --formats entry: the model's own, or llama.cpp's requantization of it (cached)."""
    if fmt == "own":
        return model
    out = cache / f"{model.stem}-{fmt}.gguf"
    if not out.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        quantize(Path(sys.executable), model, out, fmt, allow_requantize=True)
    return out


def print_table(rows: list[tuple[str, Path, dict]], args) -> None:
    print(f"\n{'format':8} {'bits/w':>6}  {'ppl FreeToken':>13} {'ppl llama.cpp':>13} {'ratio':>7} {'mean KL':>9} "
          f"{'top-1':>7} {'greedy':>7}  matrices")
    for fmt, f, r in rows:
        mix, bits = type_mix(f)
        ppl = (f"{r['ppl_ft'].ppl:13.4f} {r['ppl_ll'].ppl:13.4f} {r['ppl_ft'].ppl / r['ppl_ll'].ppl:7.4f} "
               f"{r['kl'].mean().item():9.6f} {r['agree'].mean().item() * 100:6.2f}%") if r["windows"] else " " * 53
        greedy = f"{r['same']}/{r['prompts']}" if r["prompts"] else "-"
        print(f"{fmt:8} {bits:6.2f}  {ppl} {greedy:>7}  {mix}")
    print(f"({args.chunks} chunks of {args.ctx}, {args.prompts} greedy answers of up to {args.max_tokens} tokens; "
          f"FreeToken --dtype {args.dtype}, ggml numerics {args.ggml_numerics})")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="a GGUF file, or smollm2 (the default) or gemma3-270m")
    ap.add_argument("--formats", default="own", help="comma list: own (the model's GGUF) and llama.cpp quantizer "
                    "mixes made from it (q8_0, q6_k, q5_0, q5_1, q4_0, q4_1, q4_k_m, q3_k_m, q2_k, iq4_nl, iq4_xs, "
                    "iq3_xxs, iq2_xxs, iq1_s, ...)")
    ap.add_argument("--cache", default=str(CACHE / "quality"), help="where the requantized GGUFs are kept")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8, help="chunks of --ctx tokens (8 x 255 = 2040 scored positions)")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32", help="FreeToken's --dtype")
    ap.add_argument("--ggml-numerics", default="auto", choices=("auto", "q8", "llama", "llama-exact", "float32"),
                    help="FreeToken's activation rounding in GGUF-quantized layers (llama: llama.cpp's q8_0/q8_1)")
    ap.add_argument("--prefill-gemm", default="auto", choices=("auto", "float32", "bfloat16"),
                    help="FreeToken's prefill GEMM (auto: what calibration picks on this CPU)")
    args = ap.parse_args()
    model = resolve(args.model)
    print(isa_line(args.threads))
    print(f"model {model}\ntext  {text_name()}")
    rows = []
    for fmt in args.formats.split(","):
        f = format_file(model, fmt, Path(args.cache))
        mix, bits = type_mix(f)
        print(f"\n== {fmt}: {f.name} ({bits:.2f} bits per matrix weight: {mix})", flush=True)
        rows.append((fmt, f, compare(f, args)))
        print_run(rows[-1][2], args)
    print_table(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
