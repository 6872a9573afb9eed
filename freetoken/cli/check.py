"""`freetoken check --model DIR`: the deployment checks as one command.

  1. the memory plan: does the pool fit, with room for the OS
  2. B_P / B_H measured on the model's expert shapes and format
  3. start the engine (timed: start-up delay)
  4. one cold request, then the same request warm: TTFT, decode tok/s, expert hit rate
  5. a diagnosis: slow first token -> transfers or re-prefill; low decode -> misses;
     CPU saturation -> the split; start-up delay -> use FTW

With --roofline: first this machine's limits (read bandwidth, peak multiply-add rate per number
format, kernels/roofline.py), the model's bytes per decode step and FLOPs per token by phase
against them, and after the requests how far the measured prefill and decode are from those
limits (their share of them). `freetoken check --roofline` without --model: the machine alone.
"""
from __future__ import annotations

import time


def register(subparsers) -> None:
    import argparse

    from ..engine.args import add_engine_args
    p = subparsers.add_parser("check", help="validate a deployment: memory plan, bandwidths, a cold and a warm "
                              "request, and a diagnosis", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="HF checkpoint directory or FTW file (required unless --roofline)")
    p.add_argument("--roofline", action="store_true", help="measure this machine's read bandwidth and peak "
                   "multiply-add rates, and the model's prefill and decode as a share of them")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--seconds", type=float, default=0.5, help="time per bandwidth measurement")
    add_engine_args(p)
    p.set_defaults(func=main)


def _request(llm, prompt: list[int], max_tokens: int) -> dict:
    from ..sampling_params import SamplingParams
    eng = llm.engine
    stats0 = _totals(llm)
    rid = f"check-{time.perf_counter_ns()}"
    t0 = time.perf_counter()
    eng.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    first, n, cached = None, 0, 0
    while eng.has_unfinished():
        for out in eng.step():
            if out.new_token_ids and first is None:
                first = time.perf_counter()
            n += len(out.new_token_ids)
            cached = max(cached, getattr(out, "num_cached_tokens", 0))
    end = time.perf_counter()
    stats1 = _totals(llm)
    hits = stats1.get("hits", 0) - stats0.get("hits", 0)
    misses = stats1.get("misses", 0) - stats0.get("misses", 0)
    return {"ttft_s": (first or end) - t0, "decode_tok_s": (n - 1) / (end - first) if first and n > 1 else 0.0,
            "hit_rate": hits / (hits + misses) if hits + misses else None, "cached_tokens": cached,
            "fill_s": stats1.get("fill_s", 0) - stats0.get("fill_s", 0),
            "cpu_s": stats1.get("cpu_s", 0) - stats0.get("cpu_s", 0)}


def _totals(llm) -> dict:
    s = llm.expert_stats()
    return s.get("total", {}) if isinstance(s, dict) else {}


def diagnose(plan, start_s: float, source_is_ftw: bool, model_gib: float, cold: dict, warm: dict,
             prof, backend: str) -> list[str]:
    """The diagnosis in the setup guide's terms, one line per finding."""
    out = []
    if not plan.warnings and plan.available:
        out.append("memory: the plan fits as asked")
    for w in plan.warnings:
        out.append(f"memory: {w}")
    if not source_is_ftw and start_s > max(5.0, 2 * model_gib):
        out.append(f"startup delay: {start_s:.1f} s to start from the HF directory -> use FTW "
                   "(`freetoken convert --model DIR --out model.ftw`)")
    if cold["ttft_s"] > 0 and warm["ttft_s"] > 0.5 * cold["ttft_s"]:
        if warm["cached_tokens"] == 0:
            out.append(f"slow first token: the warm request re-prefilled its whole prompt (TTFT {warm['ttft_s']:.2f} s "
                       f"vs cold {cold['ttft_s']:.2f} s) -> re-prefill: enable the prefix cache")
        elif cold["fill_s"] > 0.5 * cold["ttft_s"]:
            out.append(f"slow first token: {cold['fill_s']:.2f} s of expert transfers in a {cold['ttft_s']:.2f} s "
                       "first token -> transfers: a larger expert cache or the hybrid split")
    if backend in ("hybrid", "offload") and warm["hit_rate"] is not None and warm["hit_rate"] < 0.5:
        out.append(f"low decode: expert cache hit rate {warm['hit_rate']:.0%} warm -> misses: raise "
                   "expert_cache_gib, or let hybrid run misses on the CPU")
    if prof is not None and prof.b_h_shared < 0.7 * prof.b_h and backend in ("hybrid", "offload"):
        out.append(f"CPU saturation: the CPU branch drops to {prof.b_h_shared / prof.b_h:.0%} of its bandwidth "
                   "while copies run -> the split q* uses the shared figures; fewer CPU threads may help")
    if len(out) == (0 if plan.warnings else 1):
        out.append("no problem found")
    return out


def roofline_section(args, cfg=None):
    """Print the machine's roofline (and the model's costs against it); returns (machine, phases, fmt)."""
    from ..kernels.roofline import measure_machine, model_costs, report, tile_ceilings
    machine = measure_machine(getattr(cfg, "num_threads", None))
    print("== roofline: " + machine.describe(), flush=True)
    one = machine.peak.get("amx_bf16", 0.0) / max(machine.threads, 1)
    tiles = tile_ceilings()
    if tiles and one:   # the prefill GEMMs' own loop: how much of the peak their structure can reach here
        print("== roofline: AMX prefill tile loop, one thread (best / median GFLOP/s, best's share of one "
              "thread's peak): " + ", ".join(f"{k} {b / 1e9:.0f} / {m / 1e9:.0f} ({b / one:.0%})"
                                              for k, (b, m) in tiles.items()), flush=True)
    if cfg is None:
        return machine, None, None
    from ..memory.model_size import read_model_shape
    shape = read_model_shape(args.model)
    c = shape.config
    layers = c.get("num_hidden_layers") or 1
    n_exp = c.get("num_experts") or c.get("n_routed_experts") or c.get("num_local_experts") or 0
    per = shape.prebuilt_expert_bytes or (shape.expert_bytes_on_disk / (layers * n_exp) if n_exp else None)
    wbytes = {"float32": 4.0}.get(cfg.dtype, 2.0)
    fmt = {"float32": "fp32"}.get(cfg.dtype, "bf16")
    phases = model_costs(c, weight_bytes=wbytes, expert_bytes=per, context=args.prompt_tokens)
    print(report(phases, machine, fmt), flush=True)
    return machine, phases, fmt


def main(args) -> int:
    import logging

    import torch

    from ..engine.args import engine_options
    from ..config import EngineConfig
    from .profile import measure, synthetic_pool
    from ..llm import LLM
    from ..weights.ftw.reader import is_ftw
    from ..progress import progress
    from ..memory.model_size import read_model_shape
    from ..memory.plan import expert_format
    from ..memory.resolve import resolve
    logging.getLogger("freetoken.memory").setLevel(logging.ERROR)
    if args.model is None:
        if not args.roofline:
            raise SystemExit("freetoken check: --model is required (or --roofline for the machine alone)")
        roofline_section(args)
        return 0
    opts = {k: v for k, v in engine_options(args).items() if v is not None}
    cfg = EngineConfig.from_options(args.model, **opts)
    roof = roofline_section(args, cfg) if args.roofline else None
    with progress(5, "check", unit="steps") as bar:
        plan = resolve(cfg).plan
        print("== memory plan\n" + plan.table(), flush=True)
        bar.update(1)
        shape = read_model_shape(args.model)
        fmt = expert_format(shape, cfg).removeprefix("prebuilt:")
        fmt = {"float": {"float32": "fp32", "float16": "fp16"}.get(cfg.dtype, "bf16")}.get(fmt, fmt)
        prof = None
        inter = shape.get("moe_intermediate_size", "intermediate_size")
        if inter and shape.get("hidden_size") and fmt in ("fp32", "bf16", "fp16", "int8", "mxfp4", "fp8"):
            pool = synthetic_pool(shape.get("hidden_size"), inter, fmt, 0.25)
            prof = measure(pool, cfg.torch_device, args.seconds, cfg.num_threads)
            print(f"== bandwidth ({fmt} experts {shape.get('hidden_size')}x{inter})\n"
                  f"B_P {prof.b_p / 1e9:.2f} GB/s alone, {prof.b_p_shared / 1e9:.2f} GB/s shared; "
                  f"B_H {prof.b_h / 1e9:.2f} GB/s alone, {prof.b_h_shared / 1e9:.2f} GB/s shared", flush=True)
        bar.update(1)
        t0 = time.perf_counter()
        llm = LLM(args.model, **opts)
        start_s = time.perf_counter() - t0
        print(f"== start: {start_s:.2f} s", flush=True)
        bar.update(1)
        vocab = llm.engine.vocab_size
        g = torch.Generator().manual_seed(0)
        prompt = torch.randint(0, vocab, (min(args.prompt_tokens, llm.engine.max_model_len - args.max_tokens - 1),),
                               generator=g).tolist()
        cold = _request(llm, prompt, args.max_tokens)
        bar.update(1)
        warm = _request(llm, prompt, args.max_tokens)
        bar.update(1)
    backend = llm.expert_stats().get("backend", "none")     # every experts backend names itself; dense: none
    tiered = backend in ("hybrid", "offload")
    for name, r in (("cold", cold), ("warm", warm)):
        hit = f", expert hit rate {r['hit_rate']:.0%}" if r["hit_rate"] is not None and tiered else ""
        print(f"== {name} request: TTFT {r['ttft_s']:.3f} s ({len(prompt)} prompt tokens, {r['cached_tokens']} "
              f"from the prefix cache), decode {r['decode_tok_s']:.1f} tok/s{hit}")
    if roof is not None:
        from ..kernels.roofline import decode_share, prefill_share
        machine, phases, fmt = roof
        if cold["ttft_s"] > 0:
            tps = len(prompt) / cold["ttft_s"]
            print(f"== roofline share: prefill {tps:.1f} tok/s = {prefill_share(phases, machine, tps, fmt, len(prompt)):.1%} of "
                  f"the {fmt} peak ({machine.ceiling(fmt)[0]})")
        if warm["decode_tok_s"] > 0:
            print(f"== roofline share: decode {warm['decode_tok_s']:.1f} tok/s = "
                  f"{decode_share(phases, machine, warm['decode_tok_s']):.1%} of the read bandwidth")
    gib = read_model_shape(args.model).expert_bytes_on_disk / 2**30
    print("== diagnosis")
    for line in diagnose(plan, start_s, is_ftw(args.model), gib, cold, warm, prof, backend):
        print(f"- {line}")
    llm.close()
    return 0
