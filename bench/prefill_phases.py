"""Where a prefill's time goes, per phase, as a share of this core's peak (outside CI).

    PYTHONPATH=. .venv/bin/python bench/prefill_phases.py [--shape medium|medium48|gpt-oss] [--prompt 4096] [--int8-tiles auto|ymm|zmm]

One engine thread (the pool runs in the caller), bf16, random-token prompts: a warm-up prompt,
then the prompt once under cProfile on the thread's CPU time (the load's time slicing is not
counted). Every function's own time goes to a phase by its file: the routed experts
(experts/, their C tiles), attention (layers/attention/, torch's flash kernel), the dense
projections (layers/linear.py, kernels/gemm.py), norms and RoPE, and the rest (the model's
glue: reshapes, dtype conversions, gathers); a torch builtin's time goes to the phase of the
function of ours that called it. Each phase's FLOPs per token (kernels/roofline.py's model_costs at
half the prompt's keys, the causal average; a sliding-window layer's at most its window) over its
time, against one thread's best burst of the bf16 peak (measured alongside). gpt-oss: the medium
gpt-oss of bench/vs_llamacpp.py's mxfp4 (MXFP4 experts, sinks, window-128 layers)."""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import time

from common import MEDIUM_QWEN3_48, medium_checkpoint, medium_gpt_oss

from freetoken import LLM, SamplingParams
from freetoken.kernels.roofline import measure_machine, model_costs

# (phase, path fragments of its functions' files), first match wins
PHASES = [("routed experts", ("freetoken/experts/",)),
          ("attention", ("freetoken/layers/attention/",)),
          ("dense projections", ("freetoken/layers/linear.py", "freetoken/kernels/gemm.py")),
          ("norms, RoPE", ("freetoken/layers/norm.py", "freetoken/layers/rope.py"))]
OTHER = "other (glue, conversions)"


def phase_of(path: str) -> str | None:
    return next((name for name, frags in PHASES if any(f in path for f in frags)), None)


def phase_times(stats: pstats.Stats) -> dict[str, float]:
    """Seconds per phase: a function of ours by its file; any other (a builtin, torch's Python
    wrappers) split over its callers by the time spent through each, up to a function of ours."""
    table = stats.stats

    def shares(func, depth=0) -> dict[str, float]:
        path = func[0]
        if "freetoken/" in path or depth > 8:
            return {phase_of(path) or OTHER: 1.0}
        callers = table[func][4] if func in table else {}
        through = {c: v[3] for c, v in callers.items()}
        whole = sum(through.values())
        if not whole:
            return {OTHER: 1.0}
        out: dict[str, float] = {}
        for c, ct in through.items():
            for name, f in shares(c, depth + 1).items():
                out[name] = out.get(name, 0.0) + f * ct / whole
        return out

    out: dict[str, float] = {}
    for func, (_, _, tt, _, _) in table.items():
        for name, f in shares(func).items():
            out[name] = out.get(name, 0.0) + f * tt
    return out


def phase_flops(cfg: dict, prompt: int) -> dict[str, float]:
    """FLOPs per prompt token per phase (the lm_head runs on the last token only: left out)."""
    half, window, types = prompt // 2, cfg.get("sliding_window"), cfg.get("layer_types")
    keys = [min(half, window) if window and t == "sliding_attention" else half for t in types or ["full"]]
    by = {p.name.split(" (")[0]: p.flops for p in model_costs(cfg, context=round(sum(keys) / len(keys)))}
    return {"routed experts": by.get("experts", 0) + by.get("router", 0) + by.get("shared experts", 0),
            "attention": by["attention"], "dense projections": by["attention projections"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="medium", choices=("medium", "medium48", "gpt-oss"))
    ap.add_argument("--prompt", type=int, default=4096)
    ap.add_argument("--int8-tiles", default="auto", choices=("auto", "ymm", "zmm"),
                    help="the int8 / mxfp4 dot tiles in ymm or zmm registers (auto: calibrated)")
    ap.add_argument("--top", dest="other", type=int, default=0, help="also print the N functions of most own time")
    args = ap.parse_args()
    model = {"medium": medium_checkpoint, "gpt-oss": medium_gpt_oss,
             "medium48": lambda: medium_checkpoint(name="qwen3-moe-medium48", **MEDIUM_QWEN3_48)}[args.shape]()
    cfg = json.loads((model / "config.json").read_text())
    llm = LLM(str(model), num_threads=1, max_model_len=args.prompt + 64, dtype="bfloat16", int8_tiles=args.int8_tiles)
    once = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    rng = random.Random(1)
    prompt = lambda: [rng.randrange(100, cfg["vocab_size"] - 100) for _ in range(args.prompt)]  # noqa: E731
    llm.generate([prompt()], once)      # warm-up: calibration, kernels built, a first long prompt
    prof = cProfile.Profile(time.thread_time)
    t = time.thread_time()
    prof.enable()
    llm.generate([prompt()], once)
    prof.disable()
    total = time.thread_time() - t
    llm.close()
    m = measure_machine(1)
    inst, peak = m.ceiling("bf16")
    times, flops = phase_times(pstats.Stats(prof)), phase_flops(cfg, args.prompt)
    n = args.prompt
    print(f"{args.shape}, {n} tokens, 1 thread, int8 tiles {args.int8_tiles}: {n / total:.0f} tok/s on thread CPU time ({total:.2f} s); "
          f"peak {inst} {peak / 1e9:.0f} GFLOP/s (best burst; median {m.median[inst] / 1e9:.0f})")
    print(f"{'phase':<28}{'s':>7}{'time':>7}{'GFLOP/s':>9}{'of peak':>9}")
    for name in [p for p, _ in PHASES] + [OTHER]:
        s = times.get(name, 0.0)
        rate = flops[name] * n / s if name in flops and s else 0.0
        print(f"{name:<28}{s:7.2f}{s / total:7.0%}" + (f"{rate / 1e9:9.0f}{rate / peak:9.1%}" if rate else ""))
    if args.other:
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.other)
    whole = sum(flops.values()) * n / total
    print(f"{'whole prefill':<28}{total:7.2f}{1:7.0%}{whole / 1e9:9.0f}{whole / peak:9.1%}")


if __name__ == "__main__":
    main()
