"""FreeToken vs llama.cpp on the same random medium checkpoint, side by side (outside CI).

    .venv/bin/python bench/vs_llamacpp.py [--threads 2] [--prompt 512] [--decode 128] [--rounds 3]
                                          [--formats bf16,q8_0,mxfp4]

bf16 and q8_0 run a medium Qwen3-MoE (q8_0: FreeToken's int8 experts and int8 dense layers,
`expert_format="int8", dense_format="int8"`, vs llama.cpp's Q8_0 GGUF);
mxfp4 runs a medium gpt-oss whose experts ship as MXFP4 and stay packed in both engines, the
rest bf16 in both (converted with --outtype bf16, which keeps the MXFP4 experts as they are).

First run installs llama-cpp-python (built from its sdist, ~13 min on 2 cores) into a cached
venv under ~/.cache/freetoken/llamacpp, and uses the sdist's own convert_hf_to_gguf.py with
its vendored gguf-py. Home-made tokenizers are mapped to the "qwen2" BPE pre-tokenizer.
Prints prefill/decode tok/s of both engines (medians over rounds that alternate which engine
goes first) and the ratios freetoken/llama.cpp (median of the per-round ratios), and how far
their greedy tokens agree."""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import CACHE, medium_checkpoint, medium_gpt_oss  # noqa: E402

LLAMA_DIR = CACHE.parent / "llamacpp"
VERSION = "0.3.36"


def ensure_llamacpp() -> tuple[Path, Path]:
    """(python of the llama.cpp venv, convert_hf_to_gguf.py)."""
    py = LLAMA_DIR / "venv" / "bin" / "python"
    src = LLAMA_DIR / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"
    ok = py.exists() and subprocess.run([py, "-c", "import llama_cpp"], capture_output=True).returncode == 0
    if not ok:
        print("installing llama-cpp-python (one-off, several minutes) ...", flush=True)
        LLAMA_DIR.mkdir(parents=True, exist_ok=True)
        steps = [
            [sys.executable, "-m", "venv", str(LLAMA_DIR / "venv")],
            [py, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
             f"llama-cpp-python=={VERSION}", "-d", str(LLAMA_DIR / "sdist")],
            ["tar", "xzf", str(LLAMA_DIR / "sdist" / f"llama_cpp_python-{VERSION}.tar.gz"), "-C", str(LLAMA_DIR)],
            [py, "-m", "pip", "install", "-q", "numpy", "torch==2.13.0", "safetensors", "sentencepiece", "transformers"],
            [py, "-m", "pip", "install", "-q", str(LLAMA_DIR / "sdist" / f"llama_cpp_python-{VERSION}.tar.gz")],
        ]
        for s in steps:
            subprocess.run(s, check=True)
    return py, src / "convert_hf_to_gguf.py"


CONVERT = textwrap.dedent("""
    import sys, runpy
    sys.path.insert(0, {gguf_py!r}); sys.path.insert(0, {src!r})
    import convert_hf_to_gguf as c
    try:
        from conversion.base import TextModel          # llama.cpp after the converter split
    except ImportError:
        TextModel = c.TextModel
    orig = TextModel.get_vocab_base_pre
    def pre(self, tokenizer):
        try:
            return orig(self, tokenizer)
        except NotImplementedError:
            return "qwen2"          # home-made byte-level BPE: same pre-tokenizer as Qwen2
    TextModel.get_vocab_base_pre = pre
    sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[1:]
    c.main()
""")


def to_gguf(py: Path, converter: Path, model_dir: Path, outtype: str) -> Path:
    out = model_dir.parent / f"{model_dir.name}-{outtype}.gguf"
    if not out.exists():
        script = CONVERT.format(gguf_py=str(converter.parent / "gguf-py"), src=str(converter.parent))
        subprocess.run([py, "-c", script, str(model_dir), "--outtype", outtype, "--outfile", str(out)], check=True)
    return out


LLAMA_RUN = textwrap.dedent("""
    import json, sys, time
    import llama_cpp, numpy as np
    from llama_cpp import Llama
    path, threads, n_decode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    prompt = json.loads(sys.stdin.read())
    # swa_full=False as llama-cli/llama-server run: sliding-window layers keep only their window
    llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=2048, n_batch=512,
                swa_full=False, verbose=False)
    llm.eval(prompt[:32]); llm.reset()                                   # warm-up
    t = time.perf_counter(); llm.eval(prompt); t_prefill = time.perf_counter() - t
    last = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),)).tolist()
    toks = []
    t = time.perf_counter()
    for _ in range(n_decode):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),))
        tok = int(logits.argmax())
        toks.append(tok)
        llm.eval([tok])
    t_decode = time.perf_counter() - t
    print(json.dumps({"prefill": len(prompt) / t_prefill, "decode": n_decode / t_decode, "tokens": toks,
                      "last_logits": last}))
""")


# format -> (checkpoint builder, GGUF --outtype, FreeToken LLM options)
FORMATS = {
    "bf16": (medium_checkpoint, "bf16", {}),
    "q8_0": (medium_checkpoint, "q8_0", {"expert_format": "int8", "dense_format": "int8"}),   # Q8_0-sized
    "mxfp4": (medium_gpt_oss, "bf16", {}),
}


def run_llamacpp(py: Path, gguf: Path, prompt: list[int], threads: int, n_decode: int) -> dict:
    r = subprocess.run([py, "-c", LLAMA_RUN, str(gguf), str(threads), str(n_decode)], input=json.dumps(prompt),
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_freetoken(model_dir: Path, prompt: list[int], threads: int, n_decode: int, **opts) -> dict:
    from freetoken import LLM, SamplingParams
    llm = LLM(str(model_dir), dtype="bfloat16", num_threads=threads, max_model_len=2048, **opts)
    g = dict(temperature=0.0, ignore_eos=True)
    llm.generate([prompt[:32]], SamplingParams(max_tokens=2, **g))
    t = time.perf_counter()
    llm.generate([prompt], SamplingParams(max_tokens=1, **g))
    t_prefill = time.perf_counter() - t
    engine = llm.engine
    engine.add_request("d", prompt, SamplingParams(max_tokens=n_decode + 1, **g))
    toks, t_first = [], None
    while engine.has_unfinished():
        for o in engine.step():
            toks.extend(o.new_token_ids)
        if t_first is None:
            t_first = time.perf_counter()
    t_decode = time.perf_counter() - t_first
    backend = llm.expert_stats().get("backend", "?")
    # all generated tokens, the prefill's first included: llama.cpp's list starts with that one too
    out = {"prefill": len(prompt) / t_prefill, "decode": n_decode / t_decode, "tokens": toks[:n_decode],
           "backend": backend, "llm": llm}
    return out


def agreement(ft: dict, ll: dict, prompt: list[int]) -> str:
    """Logit error at the prompt's last position, and whether every greedy disagreement is a near-tie:
    llama.cpp's tokens are fed to FreeToken (teacher forcing) and its top-2 margin is checked there."""
    llm = ft.pop("llm")
    ids = prompt + ll["tokens"][:-1]
    logits = llm.score(ids)[len(prompt) - 1:]
    llm.close()
    ref = torch.tensor(ll["last_logits"])
    err = (logits[0] - ref).abs().max().item() / ref.abs().max().item()
    ours = logits.argmax(-1).tolist()
    top2 = torch.topk(logits, 2, dim=-1).values
    margins = (top2[:, 0] - top2[:, 1]).tolist()
    diffs = [i for i, (a, b) in enumerate(zip(ours, ll["tokens"])) if a != b]
    worst = max((margins[i] for i in diffs), default=0.0)
    scale = logits.abs().max().item()
    return (f"last-prompt-position logits: max abs diff {err:.1%} of scale; teacher-forced greedy agrees at "
            f"{len(ours) - len(diffs)}/{len(ours)} positions, largest top-2 margin among disagreements "
            f"{worst:.3f} ({worst / scale:.1%} of the logit scale)")


def side_by_side(py, gguf, model, prompt, args, ft_opts) -> tuple[dict, dict, list[tuple[float, float]]]:
    """`args.rounds` rounds, the engines' order alternating (this machine's speed drifts over
    minutes): the medians of each engine's figures, the last FreeToken run (kept open for the
    agreement check) and each round's (prefill, decode) ratios."""
    lls, fts, ratios = [], [], []
    for r in range(args.rounds):
        pair = {}
        for engine in (("llama.cpp", "freetoken") if r % 2 == 0 else ("freetoken", "llama.cpp")):
            if engine == "llama.cpp":
                pair[engine] = run_llamacpp(py, gguf, prompt, args.threads, args.decode)
            else:
                if fts:
                    fts[-1].pop("llm").close()
                pair[engine] = run_freetoken(model, prompt, args.threads, args.decode, **ft_opts)
        lls.append(pair["llama.cpp"])
        fts.append(pair["freetoken"])
        ratios.append((pair["freetoken"]["prefill"] / pair["llama.cpp"]["prefill"],
                       pair["freetoken"]["decode"] / pair["llama.cpp"]["decode"]))
    med = lambda runs, k: statistics.median(x[k] for x in runs)  # noqa: E731
    ll = {**lls[-1], "prefill": med(lls, "prefill"), "decode": med(lls, "decode")}
    ft = {**fts[-1], "prefill": med(fts, "prefill"), "decode": med(fts, "decode")}
    return ft, ll, ratios


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="side-by-side rounds per format (median reported)")
    ap.add_argument("--formats", default="bf16", help="comma list of " + ", ".join(FORMATS))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    py, converter = ensure_llamacpp()
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 8000, (args.prompt,), generator=g).tolist()      # both vocabs are 8192
    rows = []
    for fmt in args.formats.split(","):
        build, outtype, ft_opts = FORMATS[fmt]
        model = build()
        gguf = to_gguf(py, converter, model, outtype)
        ft, ll, ratios = side_by_side(py, gguf, model, prompt, args, ft_opts)
        same = next((i for i, (a, b) in enumerate(zip(ft["tokens"], ll["tokens"])) if a != b), len(ll["tokens"]))
        rows.append((fmt, model, ft, ll, ratios, same, agreement(ft, ll, prompt)))
    print(f"\nbatch 1, {args.threads} threads, prompt {args.prompt}, decode {args.decode}, "
          f"median of {args.rounds} alternating rounds")
    print(f"{'format':8}{'engine':12}{'prefill tok/s':>15}{'decode tok/s':>14}")
    for fmt, model, ft, ll, ratios, same, agree in rows:
        print(f"{fmt:8}{'freetoken':12}{ft['prefill']:15.1f}{ft['decode']:14.2f}   (model {model.name}, "
              f"moe backend {ft['backend']})")
        print(f"{'':8}{'llama.cpp':12}{ll['prefill']:15.1f}{ll['decode']:14.2f}")
        rp, rd = statistics.median(r[0] for r in ratios), statistics.median(r[1] for r in ratios)
        print(f"{'':8}{'ratio':12}{rp:14.2f}x{rd:13.2f}x   per round: "
              + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in ratios))
        print(f"{'':20}free-running greedy tokens agree for the first {same} of {len(ll['tokens'])}; {agree}")


if __name__ == "__main__":
    main()
