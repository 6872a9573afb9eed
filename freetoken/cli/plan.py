"""`freetoken plan --model DIR [engine options]`: the memory plan, without loading weights."""
from __future__ import annotations

import json


def register(subparsers) -> None:
    from ..engine.args import add_engine_args
    p = subparsers.add_parser("plan", help="print the memory plan (weights, expert cache, KV, activations) "
                              "without loading the model",
                              description="Print what the engine would put in host and device memory for "
                              "these options on this machine, and which asked-for sizes it would reduce.")
    p.add_argument("--model", required=True, help="HF checkpoint directory or FTW file")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    add_engine_args(p)
    p.set_defaults(func=main)


def main(args) -> int:
    from ..engine.args import engine_options
    from ..config import EngineConfig
    import logging

    from ..memory.resolve import resolve
    logging.getLogger("freetoken.memory").setLevel(logging.ERROR)     # warnings are printed below
    opts = {k: v for k, v in engine_options(args).items() if v is not None}
    for k in ("max_num_seqs", "max_num_batched_tokens"):
        if getattr(args, k) is not None:
            opts[k] = getattr(args, k)
    plan = resolve(EngineConfig.from_options(args.model, **opts)).plan
    if args.json:
        print(json.dumps(plan.to_json(), indent=2))
        return 0
    print(plan.table())
    for w in plan.warnings:
        print(f"warning: {w}")
    print("resolved: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                   for k, v in plan.options.items()))
    return 0
