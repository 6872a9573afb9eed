"""Throughput when the KV cache is short (issue #15, defect 3): requests that together need
a little more KV than there is, run together vs each alone on an engine of the same size.
Prints the throughput ratio (together / alone, ~1 or more means no thrashing), the
scheduler's preemptions, and whether every greedy output equals the same request alone.

Scenarios (random-weight tiny Qwen3-MoE, fp32, prefix cache on as served):
  two:   2 requests whose prompt + output need 1% more KV than the cache holds
  three: 3 requests of ~5k tokens (prompt + output) with KV for ~2 of them

    python bench/kv_pressure.py                      # both scenarios
    python bench/kv_pressure.py --scenario three --prompt 4900 --gen 100
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from common import CACHE  # noqa: E402
from freetoken import LLM, SamplingParams  # noqa: E402


def checkpoint() -> Path:
    from freetoken.tiny import make_tiny
    out = CACHE / "kv-pressure-tiny-qwen3-moe"
    if not (out / "config.json").is_file():
        make_tiny("qwen3_moe", out, max_position_embeddings=16384)
    return out


def engine(model: Path, capacity_tokens: int) -> LLM:
    """An engine whose KV cache holds about `capacity_tokens` tokens."""
    probe = LLM(str(model), dtype="float32", max_model_len=16384, kv_cache_gib=0.01)
    kv = probe.engine.kv_usage()
    per_token = probe.engine.memory_sizes()["kv_cache"]["bytes"] / (kv.num_blocks * kv.block_size)
    probe.close()
    tokens = capacity_tokens // 16 * 16 - 0.5      # the engine rounds up to whole 16-token blocks
    llm = LLM(str(model), dtype="float32", max_model_len=16384, max_num_seqs=8,
              kv_cache_gib=tokens * per_token / 2**30)
    return llm


def run(llm: LLM, prompts: list[list[int]], gen: int) -> tuple[list[list[int]], float, int]:
    """(greedy outputs, seconds, preemptions) of the prompts run together."""
    eng = llm.engine
    preempted: list[str] = []
    eng.on_preempt(preempted.append)            # this run's preemptions (a listener stays registered)
    params = SamplingParams(max_tokens=gen, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    rids = [f"kv-{time.perf_counter_ns()}-{i}" for i in range(len(prompts))]
    for rid, p in zip(rids, prompts):
        eng.add_request(rid, p, params)
    toks = {r: [] for r in rids}
    while eng.has_unfinished():
        for o in eng.step():
            toks[o.request_id] += o.new_token_ids
    return [toks[r] for r in rids], time.perf_counter() - t0, len(preempted)


def scenario(model: Path, name: str, n: int, prompt: int, gen: int, capacity: int, seed: int) -> dict:
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 500) for _ in range(prompt)] for _ in range(n)]
    together_llm = engine(model, capacity)
    cap = together_llm.engine.capacity_tokens
    outs, t_together, pre = run(together_llm, prompts, gen)
    together_llm.close()
    alone_llm = engine(model, capacity)          # a fresh cache: no prefix hits from the run above
    alone, t_alone, pre_alone = [], 0.0, 0
    for p in prompts:
        (o,), t, k = run(alone_llm, [p], gen)
        alone.append(o)
        t_alone += t
        pre_alone += k
    alone_llm.close()
    need = n * (prompt + gen)
    r = {"scenario": name, "requests": n, "prompt": prompt, "gen": gen, "kv_tokens": cap,
         "need_over_capacity": need / cap, "together_s": t_together, "alone_s": t_alone,
         "together_tok_s": n * gen / t_together, "alone_tok_s": n * gen / t_alone,
         "ratio": t_alone / t_together, "preemptions": pre, "preemptions_alone": pre_alone,
         "outputs_equal": outs == alone}
    print(f"{name}: {n} x ({prompt} prompt + {gen} generated) tokens, KV {cap} tokens "
          f"(need {r['need_over_capacity']:.2f}x it):\n"
          f"  together {t_together:.2f} s ({r['together_tok_s']:.1f} tok/s), each alone in turn "
          f"{t_alone:.2f} s ({r['alone_tok_s']:.1f} tok/s): ratio {r['ratio']:.2f}x; "
          f"preemptions {pre} (alone {pre_alone}); greedy outputs equal to alone: {r['outputs_equal']}",
          flush=True)
    return r


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", choices=["two", "three", "both"], default="both")
    p.add_argument("--prompt", type=int, default=None, help="prompt tokens per request")
    p.add_argument("--gen", type=int, default=None, help="generated tokens per request")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    model = checkpoint()
    results = []
    if a.scenario in ("two", "both"):
        pr, g = a.prompt or 1000, a.gen or 200
        results.append(scenario(model, "two", 2, pr, g, int(2 * (pr + g) / 1.01), a.seed))
    if a.scenario in ("three", "both"):
        pr, g = a.prompt or 4900, a.gen or 100
        results.append(scenario(model, "three", 3, pr, g, int(2.05 * (pr + g)), a.seed))
    ok = all(r["outputs_equal"] and r["ratio"] > 0.5 for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
