"""Runtime resizing under load: 4 streams decode while the expert cache and the KV pool are
halved and grown back every few steps, side by side with an undisturbed engine.

    .venv/bin/python bench/resize.py [--steps 48] [--every 4] [--streams 4] [--dtype bfloat16]

Two engines over the same random checkpoint (moe_backend=offload: the expert cache is a slot
tier in host memory on a CPU-only machine, as on a GPU) take turns of `--every` steps, so
machine noise hits both alike. The resized one halves its expert cache and KV pool (KV blocks
handed out in scattered order, so held blocks must move) before one turn and grows them back
before the next. Prints: tokens identical yes/no, KV blocks leaked after the run (blocks held
beyond what the prefix tree owns; and the block manager / prefix tree invariants), resizes
and what they did, and decode throughput resized / undisturbed.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import medium_checkpoint  # noqa: E402
from freetoken import LLM, SamplingParams  # noqa: E402

GiB = 1 << 30
SHAPE = dict(layers=4, experts=32, top_k=4, hidden=1024, vocab=8192, moe_intermediate_size=512,
             intermediate_size=2048, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
             max_position_embeddings=4096)


def engine(model, args):
    return LLM(str(model), dtype=args.dtype, moe_backend="offload", expert_cache_slots=args.slots,
               kv_block_size=16, max_model_len=1024, max_num_seqs=args.streams,
               kv_cache_gib=args.kv_gib, max_num_batched_tokens=512).engine


def add(eng, args, params):
    r = random.Random(0)
    shared = [r.randrange(8000) for _ in range(args.prompt // 2)]
    for i in range(args.streams):
        eng.add_request(f"s{i}", shared + [r.randrange(8000) for _ in range(args.prompt // 2 + 8 * i)], params)


def turn(eng, steps, toks):
    """Up to `steps` engine steps; (seconds, tokens produced)."""
    t0, n = time.perf_counter(), 0
    for _ in range(steps):
        if not eng.has_unfinished():
            break
        for o in eng.step():
            toks.setdefault(o.request_id, []).extend(o.new_token_ids)
            n += len(o.new_token_ids)
    eng.runner.idle()        # hand torch's thread count back: the engines share it (model_runner.py)
    return time.perf_counter() - t0, n


def leaked(eng) -> int:
    """KV blocks still held by something other than the prefix tree once every request ended."""
    eng.blocks.check([s.block_table for s in eng.scheduler.running])
    eng.prefix.check()
    return eng.blocks.num_used - eng.prefix.num_nodes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=48, help="decode tokens per stream")
    ap.add_argument("--every", type=int, default=4, help="steps between resizes")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=96)
    ap.add_argument("--slots", type=int, default=64, help="expert cache slots (of layers x experts)")
    ap.add_argument("--kv-gib", type=float, default=0.05)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--only", choices=["expert_cache", "kv_cache", "none"], default=None, help="resize just this one")
    ap.add_argument("--seed", type=int, default=None, help="sample at temperature 0.8 with this seed (default greedy)")
    args = ap.parse_args()

    model = medium_checkpoint(name="qwen3-moe-resize", **SHAPE)
    params = SamplingParams(max_tokens=args.steps, ignore_eos=True,
                            **({"temperature": 0.8, "seed": args.seed} if args.seed is not None else {"temperature": 0.0}))
    base, elastic = engine(model, args), engine(model, args)
    if args.only != "none":
        random.Random(1).shuffle(elastic.blocks.free)            # scattered blocks: shrinking must move some
    S = elastic.model.experts.S
    full = {"expert_cache_gib": args.slots * S / GiB, "kv_cache_gib": elastic.runner.kv_nbytes / GiB}
    if args.only:
        full = {k: v for k, v in full.items() if k.startswith(args.only)} or {"state_cache_gib": 1.0}
    half = {k: v / 2 for k, v in full.items()}
    add(base, args, params)
    add(elastic, args, params)

    ref, got = {}, {}
    t_base = t_el = t_resize = 0.0
    n_base = n_el = 0
    resizes, moved, preempted, evicted, shrinks = 0, 0, 0, 0, 0
    while base.has_unfinished() or elastic.has_unfinished():
        s, n = turn(base, args.every, ref)
        t_base, n_base = t_base + s, n_base + n
        s, n = turn(elastic, args.every, got)
        t_el, n_el = t_el + s, n_el + n
        if elastic.has_unfinished():
            t0 = time.perf_counter()
            r = elastic.resize_memory(**(half if resizes % 2 == 0 else full), trigger="bench")
            t_resize += time.perf_counter() - t0
            kv = r["components"].get("kv_cache") or dict.fromkeys(
                ("moved_blocks", "preempted", "evicted_blocks", "blocks_after", "blocks_before"), 0)
            moved, preempted, evicted = moved + kv["moved_blocks"], preempted + kv["preempted"], evicted + kv["evicted_blocks"]
            shrinks += kv["blocks_after"] < kv["blocks_before"]
            resizes += 1
    same = ref == got
    base_tps, el_tps = n_base / t_base, n_el / (t_el + t_resize)
    print(f"model {model.name}: {SHAPE['layers']} layers x {SHAPE['experts']} experts, {args.dtype}, "
          f"{args.streams} streams x {args.steps} tokens, {'greedy' if args.seed is None else f'seed {args.seed}'}")
    print(f"resizes: {resizes} (expert cache {args.slots} <-> {args.slots // 2} slots, KV pool "
          f"{base.blocks.num_blocks} <-> ~{base.blocks.num_blocks // 2} blocks; {shrinks} KV shrinks), "
          f"{moved} KV blocks moved, {evicted} cached blocks evicted, {preempted} preemptions, "
          f"{t_resize / max(resizes, 1) * 1e3:.1f} ms per resize")
    print(f"tokens identical: {'yes' if same else 'NO'}")
    print(f"KV blocks leaked: {leaked(elastic)} (undisturbed: {leaked(base)})")
    print(f"decode throughput: undisturbed {base_tps:.1f} tok/s, resized {el_tps:.1f} tok/s "
          f"(resize time included): ratio {el_tps / base_tps:.3f}")
    if not same:
        for rid in sorted(ref):
            a, b = ref[rid], got.get(rid, [])
            k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            if k is not None or len(a) != len(b):
                print(f"  {rid}: first difference at token {k} of {len(a)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
