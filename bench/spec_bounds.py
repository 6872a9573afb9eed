"""Model-free bounds of speculative decoding on bench/speculative.py's replay: what the drafters
could give on the same forced agent turns, whatever the machine's load.

    PYTHONPATH=. .venv/bin/python bench/spec_bounds.py [--sessions 2] [--turns 6] [--prompt 768]
        [--response 96] [--history 0,20] [--max-draft 16] [--cost 1,1.11,1.19,1.33,1.48,1.61,1.74,1.87,1.99]
        [--no-shadow] [--offset 0]

The same turns as bench/speculative.py (same picks, truncation, ids folded into 8192), replayed
with the responses forced, one draft a step. Per drafter set (suffix, prompt lookup, both as
`auto` picks), three figures:
- tokens a verify step with every draft at its full length k (no price: the drafters alone);
- `priced`: speed-up over plain decoding when the draft and k are chosen by the engine's own rule
  (spec/decide.py: acceptance statistics per drafter and bucket, buckets refined by whether the
  drafters agree, the most expected tokens less the run's speed x the extra cost), with a verify
  of k drafts costing --cost[k] plain steps (default: the medium dense model's quiet curve,
  docs/benchmarks.md; the trace-routed MoE's stop-41 curve was 1,1.42,1.48,1.77,2.05,2.35,2.65,2.95,3.26,
  the bytes its verifies read 1,1.38,1.72,2.0,2.29,2.52,2.75,2.98,3.2); the drafts the price turns
  down are scored as the engine scores them (spec/shadow.py; --no-shadow: not, as before);
- `oracle`: the speed-up of a price that knew which drafts hit (drafts exactly the run that will
  be accepted, when it pays): no price can beat it with these drafters.
As the bench, the replay runs twice with fresh drafters and the statistics carried over; the
second run is reported, and priced's first (the statistics cold, as bench/speculative.py
--rounds 1 runs: the second pass's statistics have seen these very turns, so finer buckets
gain there partly by remembering them). --history N: the suffix index first sees N other sessions (as
bench/speculative.py --history). --offset j: the j-th session after each of those picks instead
(the same spacing): sessions held out from whatever was tuned on the default picks."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from speculative import fresh_drafters, qwen2_encode, session_turns  # noqa: E402

from freetoken.engine.spec.acceptance import AcceptanceStats, Speedup  # noqa: E402
from freetoken.engine.spec.decide import MARGIN, choose, likeliest  # noqa: E402
from freetoken.engine.spec.drafters import with_agreement  # noqa: E402

VOCAB = 8192


def accepted(draft, resp: list[int], pos: int) -> int:
    n = 0
    for a, b in zip(draft.tokens, resp[pos:]):
        if a != b:
            break
        n += 1
    return n


def replay(drafters: dict, turns, cost: list[float], K: int, stats: AcceptanceStats, mode: str,
           shadow: bool = True, speed: Speedup | None = None) -> float:
    """mode full: tokens a verify step, every draft at its full length; priced / oracle: speed-up
    over plain (tokens per unit of plain-step time). Priced is the engine's rule for one sequence
    alone in a step (spec/decide.py: the proposals' buckets refined by their agreement, the draft
    and k with the most expected tokens less the run's speed x the extra cost, `speed` carried
    over as the statistics are). shadow: the statistics also learn from the proposals not
    verified, as the engine's (spec/shadow.py)."""
    speed = Speedup() if speed is None else speed
    steps = spent = tokens = 0.0
    for t, (prompt, resp) in enumerate(turns):
        pos = 0
        while pos < len(resp):
            ctx = prompt + resp[:pos]
            room = min(K, len(resp) - pos - 1)
            drafts = []
            for d in drafters.values():
                d.observe(t, ctx, 0)
                if room > 0 and (dr := d.propose(ctx, room, key=t)) is not None:
                    drafts.append(dr)
            drafts = with_agreement(drafts)
            k = acc = 0
            if drafts and mode == "oracle":
                acc = max(accepted(dr, resp, pos) for dr in drafts)
                k = acc if acc and (1 + acc) / cost[acc] > 1 / cost[0] else 0
                acc = acc if k else 0
            elif drafts:
                dr, k = (likeliest(drafts, stats), None) if mode == "full" else \
                    choose(drafts, stats, lambda d, j: cost[j] - cost[0], MARGIN * speed.value / cost[0])
                if mode == "full":
                    k = len(dr.tokens)
                if k:
                    acc = min(accepted(dr, resp, pos), k)
                    stats.observe(dr.drafter, dr.bucket, k, acc)
                elif shadow and mode == "priced":         # the engine scores the draft it did not make
                    dr = likeliest(drafts, stats)
                    stats.observe_shadow(dr.drafter, dr.bucket, len(dr.tokens), accepted(dr, resp, pos))
            speed.step(1, cost[k] / cost[0])
            speed.accepted(acc)
            steps += 1
            spent += cost[k]
            pos += min(acc + 1, len(resp) - pos)
        for d in drafters.values():
            d.observe(t, prompt + resp, 0)
            d.forget(t)
        tokens += len(resp)
    return tokens / (steps if mode == "full" else spent)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=2)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--prompt", type=int, default=768)
    ap.add_argument("--response", type=int, default=96)
    ap.add_argument("--offset", type=int, default=0,
                    help="replay the j-th session after each of the bench's picks: sessions held out from tuning")
    ap.add_argument("--history", default="0,20", help="comma-separated: other sessions the suffix index sees first")
    ap.add_argument("--max-draft", type=int, default=16)
    ap.add_argument("--cost", default="1,1.11,1.19,1.33,1.48,1.61,1.74,1.87,1.99",
                    help="a verify of k = 0.. drafts in plain steps (k past the list: extended linearly)")
    ap.add_argument("--no-shadow", action="store_true",
                    help="the statistics learn from verified drafts only (the price before spec/shadow.py)")
    args = ap.parse_args()
    cost = [float(x) for x in args.cost.split(",")]
    if len(cost) < 2 or cost[0] <= 0:
        sys.exit("--cost: at least two positive figures, k = 0 first")
    while len(cost) <= args.max_draft:
        cost.append(2 * cost[-1] - cost[-2])
    encode = qwen2_encode()
    print(f"sessions {args.sessions}, turns {args.turns}, prompt {args.prompt}, response {args.response}, "
          f"max draft {args.max_draft}, cost {', '.join(f'{c:.2f}' for c in cost)}")
    print("history   drafters        tokens/verify (full k)   priced x plain   oracle x plain   priced, 1st pass")
    for h in (int(x) for x in args.history.split(",")):
        args.history = h
        turns, history = session_turns(args, encode, VOCAB)
        for label, names in (("suffix", ("suffix",)), ("prompt lookup", ("ngram",)), ("auto (both)", ("suffix", "ngram"))):
            out = []
            for mode in ("full", "priced", "oracle"):
                stats, speed = AcceptanceStats(args.max_draft), Speedup()
                for _ in range(2):
                    d = {n: v for n, v in fresh_drafters(history).items() if n in names}
                    r = replay(d, turns, cost, args.max_draft, stats, mode, not args.no_shadow, speed)
                    out.append(r)
            print(f"{h:7d}   {label:14s} {out[1]:22.3f}   {out[3]:14.3f}   {out[5]:14.3f}   {out[2]:16.3f}", flush=True)


if __name__ == "__main__":
    main()
