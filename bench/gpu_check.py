"""The one-call GPU check's measurements (run by bench/gpu_check.sh after `pytest -m cuda`).

On the medium Qwen3-class model (bench/common.py): decode tok/s of resident / hybrid / offload /
cpu at 10, 30 and 100% of the experts cached, the bandwidth profile (`freetoken profile`'s
measurement), prefill of a 4k prompt with whole-layer double buffering on and off (alternating
rounds, fresh prompts), decode with CUDA graphs on and off (`resident`, batches of 1 and 4,
alternating rounds), cold start, peak device memory and peak host memory. Writes
gpu_check.json and gpu_check.md into the output folder. The dry run drives the graph runner with
its eager "capture" (cuda_graphs.eager_capture), which measures nothing about graphs.

    PYTHONPATH=. python bench/gpu_check.py --out DIR               # on a GPU
    PYTHONPATH=. python bench/gpu_check.py --device cpu --tiny --out DIR   # dry run (CI)
"""
from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import time
from pathlib import Path

import torch

CACHE_FRACTIONS = (0.1, 0.3, 1.0)


def _prompt(n: int, vocab: int, rng: random.Random) -> list[int]:
    return [rng.randrange(10, vocab - 10) for _ in range(n)]      # fresh: no prefix-cache hit


def _llm(model, device, **opts):
    from freetoken import LLM
    t0 = time.perf_counter()
    llm = LLM(str(model), dtype="bfloat16", device=device, **opts)
    return llm, time.perf_counter() - t0


def _decode(llm, vocab, rng, tokens: int) -> float:
    from freetoken.sampling_params import SamplingParams
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    llm.generate([_prompt(16, vocab, rng)], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    t0 = time.perf_counter()
    out = llm.generate([_prompt(16, vocab, rng)], params)[0]
    return len(out.token_ids) / (time.perf_counter() - t0)


def _decode_batch(llm, vocab, rng, tokens: int, batch: int) -> float:
    from freetoken.sampling_params import SamplingParams
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate([_prompt(16, vocab, rng) for _ in range(batch)], params)
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0)


def graphs_decode(model, device, vocab: int, tokens: int, rounds: int, rng, batches=(1, 4)) -> dict:
    """`resident` decode tok/s with CUDA graphs on and off, alternating rounds, medians."""
    from freetoken.engine.cuda_graphs import DecodeGraphs, eager_capture
    llms = {}
    for mode in ("off", "on"):
        on = mode == "on" and device.type == "cuda"
        llms[mode], _ = _llm(model, device, moe_backend="resident", cuda_graphs=on, max_num_seqs=max(batches))
    if device.type != "cuda":                 # dry run: the runner's logic with the eager "capture"
        r = llms["on"].engine.runner
        kmax = -(-llms["on"].engine.max_model_len // r.block_size) * r.block_size
        r.graphs = DecodeGraphs(r._static_step, max(batches), kmax, device, eager_capture)
    res: dict = {"batches": list(batches), "rounds": rounds, "tok_s": {}}
    try:
        for llm in llms.values():
            _decode_batch(llm, vocab, rng, 2, max(batches))              # warm-up, captures the buckets
        for b in batches:
            times = {"on": [], "off": []}
            for _ in range(rounds):
                for mode in ("off", "on"):
                    times[mode].append(_decode_batch(llms[mode], vocab, rng, tokens, b))
            res["tok_s"][str(b)] = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        g = llms["on"].engine.runner.graphs
        res["replays"], res["disabled"] = g.replays, g.disabled
        res["capture"] = "cuda" if device.type == "cuda" else "eager (dry run)"
    finally:
        for llm in llms.values():
            llm.close()
    return res


def decode_table(model, device, total_experts: int, vocab: int, tokens: int, rng,
                 fractions=CACHE_FRACTIONS) -> list[dict]:
    rows = []
    runs = [("resident", None), ("cpu", None)] + [(b, f) for b in ("hybrid", "offload") for f in fractions]
    for backend, frac in runs:
        opts = {"moe_backend": backend}
        if frac is not None:
            opts["expert_cache_slots"] = max(1, round(frac * total_experts))
        if device.type != "cuda" and backend == "resident":
            continue                                  # resident needs the device
        llm, start_s = _llm(model, device, **opts)
        try:
            tps = _decode(llm, vocab, rng, tokens)
            stats = llm.expert_stats()
        finally:
            llm.close()
        rows.append({"backend": backend, "cache_fraction": frac, "decode_tok_s": tps, "start_s": start_s,
                     "hit_rate": (stats.get("total") or {}).get("hit_rate")})
    return rows


def prefill_double_buffering(model, device, total_experts: int, vocab: int, prompt_tokens: int, rounds: int,
                             rng) -> dict:
    """Offload with room for two layers: whole-layer streaming on vs off, alternating rounds."""
    llm, _ = _llm(model, device, moe_backend="offload", expert_cache_slots=total_experts,
                  max_num_batched_tokens=prompt_tokens, max_model_len=prompt_tokens + 64)
    times = {"on": [], "off": []}
    try:
        tiered = llm.engine.model.experts
        streamer = tiered.streamer
        llm.score(_prompt(prompt_tokens, vocab, rng))                # warm-up (learns the top-k)
        for _ in range(rounds):
            for mode in ("on", "off"):
                tiered.resize_cache(0)
                tiered.resize_cache(total_experts)               # the same cold cache both sides
                tiered.streamer = streamer if mode == "on" else None
                t0 = time.perf_counter()
                llm.score(_prompt(prompt_tokens, vocab, rng))
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times[mode].append(time.perf_counter() - t0)
    finally:
        llm.close()
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    return {"prompt_tokens": prompt_tokens, "rounds": rounds, "median_s": med,
            "tok_s": {k: prompt_tokens / v for k, v in med.items()}, "speedup_on_over_off": med["off"] / med["on"]}


def profile(model, device, seconds: float) -> dict:
    from freetoken.experts.measure.bandwidth import profile_q_rates
    from freetoken.cli.profile import model_format
    from freetoken.experts.measure.probe import measure, synthetic_pool
    hidden, inter, fmt = model_format(str(model))
    prof = measure(synthetic_pool(hidden, inter, fmt, 0.25), device, seconds)
    b_p, b_h = profile_q_rates(prof)
    return {"b_p_gbs": prof.b_p / 1e9, "b_h_gbs": prof.b_h / 1e9, "b_p_shared_gbs": prof.b_p_shared / 1e9,
            "b_h_shared_gbs": prof.b_h_shared / 1e9, "q_rates_gbs": [b_p / 1e9, b_h / 1e9],
            "q_star_over_m": b_p / b_h, "key": prof.key}


def markdown(res: dict) -> str:
    lines = [f"# GPU check ({res['device']}, {res['model']})", "",
             f"cold start {res['cold_start_s']:.2f} s; peak device memory {res['peak_device_gib']:.2f} GiB; "
             f"peak host memory {res['peak_host_gib']:.2f} GiB", "",
             "| backend | cache | decode tok/s | hit rate | start s |", "|---|---|---|---|---|"]
    for r in res["decode"]:
        cache = "-" if r["cache_fraction"] is None else f"{r['cache_fraction']:.0%}"
        hit = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.2f}"
        lines.append(f"| {r['backend']} | {cache} | {r['decode_tok_s']:.1f} | {hit} | {r['start_s']:.2f} |")
    p = res["prefill"]
    lines += ["", f"prefill {p['prompt_tokens']} tokens: double buffering {p['tok_s']['on']:.0f} tok/s, "
              f"without {p['tok_s']['off']:.0f} tok/s ({p['speedup_on_over_off']:.2f}x, medians of {p['rounds']})",
              "", f"profile: B_P {res['profile']['b_p_gbs']:.1f} GB/s, B_H (q*) {res['profile']['q_rates_gbs'][1]:.1f} "
              f"GB/s, q*/m {res['profile']['q_star_over_m']:.2f}", ""]
    g = res["graphs"]
    lines += [f"decode, resident, CUDA graphs ({g['capture']} capture; replays {g['replays']}"
              + (f"; turned off: {g['disabled']}" if g["disabled"] else "") + "):",
              "", "| batch | graphs off tok/s | graphs on tok/s | on/off |", "|---|---|---|---|"]
    for b, t in g["tok_s"].items():
        lines.append(f"| {b} | {t['off']:.1f} | {t['on']:.1f} | {t['on'] / t['off']:.2f}x |")
    return "\n".join(lines + [""])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a tiny model and few tokens (dry run of the script)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing measured")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    if args.tiny:
        from freetoken.tiny import make_tiny
        model = out / "tiny-model"
        if not (model / "config.json").exists():
            make_tiny("qwen3_moe", model, layers=2, experts=8, top_k=2, dtype="bfloat16")
        tokens, prompt, rounds, seconds, fractions = 4, 64, 1, 0.05, (0.3,)
    else:
        sys.path.insert(0, str(Path(__file__).parent))
        from common import medium_checkpoint
        model = medium_checkpoint()
        tokens, prompt, rounds, seconds, fractions = 64, 4096, 3, 1.0, CACHE_FRACTIONS
    cfg = json.loads((model / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg["n_routed_experts"]
    total, vocab = cfg["num_hidden_layers"] * experts, cfg["vocab_size"]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    llm, _ = _llm(model, device)
    llm.score(_prompt(8, vocab, rng))
    cold = time.perf_counter() - t0
    llm.close()
    res = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "model": str(model),
           "cold_start_s": cold, "decode": decode_table(model, device, total, vocab, tokens, rng, fractions),
           "prefill": prefill_double_buffering(model, device, total, vocab, prompt, rounds, rng),
           "profile": profile(model, device, seconds),
           "graphs": graphs_decode(model, device, vocab, tokens, rounds, rng)}
    res["peak_device_gib"] = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    res["peak_host_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    (out / "gpu_check.json").write_text(json.dumps(res, indent=2))
    (out / "gpu_check.md").write_text(markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
