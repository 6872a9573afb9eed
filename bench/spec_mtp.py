"""The cost side of MTP drafts (`--speculative mtp`) on a medium DeepSeek-V3 with one nextn layer
(random weights, built once and cached):

    PYTHONPATH=. .venv/bin/python bench/spec_mtp.py [--threads 2] [--steps 16] [--rounds 3] [--prompt 256]

Per draft length k, one sequence decoding with every step drafting k tokens through the nextn
layer (pricing off): the verify step's seconds (the pending token + k drafts through the main
model), the drafter's seconds (the catch-up row from the main model's hidden state + k - 1
chained rows, each through the nextn layer, its experts and the shared head), their sum against
a plain step, and the accepted tokens per step a k-draft must average to pay (sum / plain - 1).
Acceptance on random weights means nothing; these costs are what a real checkpoint pays too.
Rounds alternate; medians."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import fresh_prompts, medium_checkpoint  # noqa: E402
from vs_llamacpp import isa_line  # noqa: E402

SHAPE = dict(layers=4, experts=32, top_k=4, hidden=1024, vocab=8192, nextn=1, moe_intermediate_size=512,
             intermediate_size=2816, num_attention_heads=8, num_key_value_heads=8, kv_lora_rank=256,
             q_lora_rank=384, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64, n_group=4, topk_group=2,
             max_position_embeddings=4096)


def one_run(llm, k: int, prompt: list[int], steps: int) -> tuple[list[float], list[float]]:
    """(verify step seconds, drafter seconds per proposal) of one request drafting k every step."""
    from freetoken import SamplingParams
    from freetoken.engine.spec.mtp import MTPDrafter
    engine = llm.engine
    spec = engine.spec
    spec.priced, spec.K = False, max(k, 1)
    drafter = MTPDrafter(engine.runner.model.mtp)
    spec.mtp = drafter
    spec.drafters = {"mtp": drafter} if k else {}
    drafts = []
    propose = drafter.propose

    def timed(ctx, n, key=None):
        t0 = time.perf_counter()
        got = propose(ctx, n, key=key)
        drafts.append(time.perf_counter() - t0)
        return got
    drafter.propose = timed
    spec.price.samples.clear()
    engine.add_request(f"mtp{k}-{time.monotonic_ns()}", prompt,
                       SamplingParams(max_tokens=steps + k + 1, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    verify = [t for n, _, t in spec.price.samples if n == 1 + k]
    return verify, drafts[1:]           # the first proposal catches up over the whole prompt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--ks", default="0,1,2,4,8")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from freetoken import LLM
    path = medium_checkpoint("deepseek_v3", "deepseek-v3-mtp-medium", **SHAPE)
    llm = LLM(str(path), speculative="mtp", num_threads=args.threads, max_model_len=2048)
    print(isa_line(args.threads))
    print(f"medium DeepSeek-V3 + 1 nextn layer {path.name}: threads {args.threads}, prompt {args.prompt}, "
          f"{args.steps} steps a run, {args.rounds} rounds (machine shared: alternating rounds, medians)")
    ks = [int(x) for x in args.ks.split(",")]
    prompt = fresh_prompts(1, args.prompt, seed=11, vocab=(100, SHAPE["vocab"] - 1))[0]
    verify = {k: [] for k in ks}
    draft = {k: [] for k in ks}
    for r in range(args.rounds):
        for k in (ks if r % 2 == 0 else ks[::-1]):
            v, d = one_run(llm, k, prompt, args.steps)
            verify[k] += v
            draft[k] += d
            print(f"  round {r} k={k}: verify {statistics.median(v) * 1e3:.2f} ms"
                  + (f", draft {statistics.median(d) * 1e3:.2f} ms" if d else ""), flush=True)
    plain = statistics.median(verify[ks[0]]) if ks[0] == 0 else None
    print("\nk   verify ms   draft ms   draft ms/token   step ms   step/plain   pays above (accepted/step)")
    for k in ks:
        v = statistics.median(verify[k])
        d = statistics.median(draft[k]) if draft[k] else 0.0
        ratio = (v + d) / plain if plain else float("nan")
        print(f"{k:<3d} {v * 1e3:9.2f}   {d * 1e3:8.2f}   {d / max(k, 1) * 1e3:14.2f}   {(v + d) * 1e3:7.2f}   "
              f"{ratio:9.2f}x   {ratio - 1:9.2f}")


if __name__ == "__main__":
    main()
