"""Speculative decoding on the medium MoE: decode tok/s with and without it, side by side.

    PYTHONPATH=. .venv/bin/python bench/speculative.py [--sessions 4] [--turns 3] [--prompt 768]
        [--response 96] [--free 4] [--free-tokens 64] [--rounds 2] [--threads 2] [--max-draft 16] [--draft-model PATH|tiny]
        [--host-cache-gib G] [--model medium|dense|smollm2|PATH] [--routing-trace PATH [--trace-layers 4]]
        [--free-from random|sessions] [--history N] [--offset J] [--curve-context N] [--lockstep [--window 16] [--control]]
        [--bf16-dot auto|on|off] [--decode-attention auto|amx|fp32] [--clock wall|process]

1. Replay: recorded agent responses (../shared/data/agent-sessions, tokenized with the Qwen2
   vocabulary, ids folded into the medium model's 8192) are forced as the outputs (a logits
   processor leaves only the recorded token), so a drafter's acceptance is its real acceptance on
   real agent text while every forward is the model's real cost. One request at a time, a
   session's turns in order (the suffix index sees the session as an agent server would).
   Prints decode tok/s plain vs --speculative auto, the ratio, and acceptance per drafter.
2. Free-running random prompts (drafts rarely right): plain vs auto (target >= 0.98x).
3. The verify cost against k: drafts of k tokens forced through one sequence's steps; the step's
   measured seconds and distinct experts next to what the price (fitted online during 1 and 2)
   predicted for it.
4. With --draft-model PATH (or `tiny`: a small random dense Qwen3 sharing the medium model's
   tokenizer): a third column, `--speculative draft` with that model (its acceptance, its measured
   seconds per drafted token, rows rolled back), beside plain and auto. Random draft weights
   predict nothing of recorded text: the row shows the price backing off (target >= 0.98x) and
   what drafting costs; a real draft model of a real target is what makes it pay.
5. --routing-trace PATH: the MoE layers route as a real model's trace routed (sim/trace_routing.py:
   position p takes the trace's decode step p mod S), on a medium MoE built with the trace's expert
   shape (Qwen3-30B-A3B's: 128 experts, top-6 as recorded), so a verify touches the real model's
   union of experts instead of random routers' (40 -> 73 distinct for 2 positions).
6. --model dense: a medium random dense Qwen3 (4 layers, hidden 2048); --model smollm2: the real
   default model (SmolLM2-135M-Instruct Q4_1), replay tokenized with its own tokenizer; with
   --free-from sessions the free-running prompts are the sessions' own (real acceptance there).
7. --history N: the suffix index first sees N other recorded sessions (evenly spaced among those
   not replayed; whole turns), as an agent server that served them would have; the model-free
   study of the sessions (docs/benchmarks.md) drafted from such a shared history.
8. --lockstep: both workloads are read in lockstep instead (bench/spec_lockstep.py): plain and
   auto decode each prompt (each replayed turn) step by step in turn on one engine. Free: the
   median of per-window ratios over --window step pairs; --control adds the same lockstep of
   plain against plain (the method's noise floor); use --free-tokens 256 or more. Replay: the
   pooled ratio of every timed step and the median of per-turn ratios, and the replay's own verify
   cost: the auto side's steps by the drafts they verified, each k's mean step seconds over the
   plain side's mean (the curve bench/spec_bounds.py --cost takes, at the replay's contexts).
   --sessions 0 skips the replay. --clock process: the lockstep's steps timed by the process's CPU
   clock (with --threads 1 the seconds a step computed, not those it waited for a core; wall: the
   default, what a user waits).
Decode time is from a request's first token to its last (prefill excluded)."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import MEDIUM_QWEN3, SHARED_DATA, fresh_prompts, medium_checkpoint  # noqa: E402
from spec_lockstep import CLOCKS, lockstep, rate, summary, window_ratios  # noqa: E402
from vs_llamacpp import isa_line  # noqa: E402

MEDIUM_VOCAB = MEDIUM_QWEN3["vocab"]
SESSIONS = SHARED_DATA / "agent-sessions"
# the medium MoE's dense shapes without experts (~0.5 GB in bf16: a dense step reads all of it)
MEDIUM_DENSE = dict(layers=4, hidden=2048, vocab=8192, intermediate_size=6144, num_attention_heads=32,
                    num_key_value_heads=4, head_dim=128, max_position_embeddings=65536)


def forced(resp: list[int]):
    """A logits processor that leaves only the recorded token at each output position."""
    def proc(out: list[int], logits: torch.Tensor) -> torch.Tensor:
        t = resp[min(len(out), len(resp) - 1)]
        keep = logits[t].clone()
        logits.fill_(float("-inf"))
        logits[t] = keep if torch.isfinite(keep) else 0.0
        return logits
    return proc


def decode_run(llm, jobs) -> tuple[float, int]:
    """Run (prompt, SamplingParams) jobs one at a time; (decode seconds, decode tokens)."""
    engine = llm.engine
    secs, toks = 0.0, 0
    for i, (prompt, params) in enumerate(jobs):
        rid = f"j{time.monotonic_ns()}-{i}"
        engine.add_request(rid, prompt, params)
        first, n = None, 0
        while engine.has_unfinished():
            for o in engine.step():
                if first is None and o.new_token_ids:
                    first = time.perf_counter()
                    n -= 1                              # the first token ends the prefill
                n += len(o.new_token_ids)
        secs += time.perf_counter() - first
        toks += n
    return secs, toks


def qwen2_encode():
    """The sessions' Qwen2 tokenizer (the random models' ids are its ids folded into their vocabulary)."""
    from tokenizers import Tokenizer

    from freetoken.weights.gguf.tokenizer import save_tokenizer_dir
    tok_dir = Path.home() / ".cache" / "freetoken" / "bench" / "qwen2-tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        save_tokenizer_dir(SESSIONS.parent / "tokenizers" / "ggml-vocab-qwen2.gguf", tok_dir)
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    return lambda text: tok.encode(text).ids


def session_turns(args, encode, vocab: int) -> tuple[list[tuple[list[int], list[int]]], list[list[int]]]:
    """(last --prompt prompt ids, first --response response ids) of each picked session turn, and
    the --history other sessions' whole turns (prompt + response ids), evenly spaced among the rest."""
    from freetoken.engine.spec.replay import load_sessions
    sessions = [s for s in load_sessions(SESSIONS, max_turns=args.turns) if s[1]] if args.sessions else []
    # --offset j: the j-th session after each pick instead (sessions held out from tuning)
    picked = sessions[args.offset::max(1, len(sessions) // max(args.sessions, 1))][:args.sessions]
    out = []
    for _, turns in picked:
        for prompt, resp in turns:
            p = [t % vocab for t in encode(prompt)][-args.prompt:]
            r = [t % vocab for t in encode(resp)][:args.response]
            if len(r) >= 2:
                out.append((p, r))
    names = {n for n, _ in picked}
    rest = [s for s in load_sessions(SESSIONS) if s[1] and s[0] not in names] if args.history else []
    history = [[t % vocab for t in encode(prompt + resp)]
               for _, turns in rest[::max(1, len(rest) // max(args.history, 1))][:args.history] for prompt, resp in turns]
    return out, history


def fresh_drafters(history: list[list[int]]) -> dict:
    """A suffix index that has seen the history sessions (as an agent server that served them
    would have), and a prompt lookup (per sequence: no history)."""
    from freetoken.engine.spec.ngram import NgramDrafter
    from freetoken.engine.spec.suffix import SuffixDrafter
    suffix = SuffixDrafter()
    for i, ids in enumerate(history):
        suffix.observe(("history", i), ids, 0)
        suffix.forget(("history", i))
    return {"suffix": suffix, "ngram": NgramDrafter()}


def replay_jobs(turns) -> list:
    from freetoken import SamplingParams
    return [(p, SamplingParams(max_tokens=len(r), temperature=0.0, ignore_eos=True, logits_processors=[forced(r)]))
            for p, r in turns]


class FixedDrafter:
    """k random tokens every step (almost never right): the cost of verifying k, not its gain."""
    name = "fixed"

    def __init__(self, k: int, vocab: int):
        self.k, self.vocab, self.rng = k, vocab, torch.Generator().manual_seed(0)

    def observe(self, *a):
        pass

    def forget(self, key):
        pass

    def propose(self, ctx, k, key=None):
        from freetoken.engine.spec.drafters import Draft
        n = min(self.k, k)
        return Draft(tuple(torch.randint(0, self.vocab, (n,), generator=self.rng).tolist()), "fixed", 0) if n else None


class CyclingDrafter(FixedDrafter):
    """Drafts of each k in `ks` in turn (a round visits every k once, in reverse every other
    round), k random tokens each: every k's steps spread over the same minutes and load."""

    def __init__(self, ks, vocab: int):
        super().__init__(0, vocab)
        self.ks, self.order, self.rounds = list(ks), [], 0

    def propose(self, ctx, k, key=None):
        if not self.order:
            self.order = self.ks if self.rounds % 2 == 0 else self.ks[::-1]
            self.order, self.rounds = list(self.order), self.rounds + 1
        self.k = self.order.pop(0)
        return super().propose(ctx, k, key)


def cost_curve(llm, ks, vocab: int, rounds: int = 8, context: int = 256):
    """Per k: (measured median step seconds, predicted seconds, distinct experts per step), the
    drafts verified after a prompt of `context` tokens (each verify row attends all of them), the
    k interleaved step by step (measured one k after another, 16 steps each, the load moved
    between them: at load 4-5 a k of 4 read 0.85x a plain step and one of 14 0.93x)."""
    from freetoken import SamplingParams
    engine = llm.engine
    spec = engine.spec
    theta = spec.price.theta.copy()
    predicted = {k: spec.price.seconds(1 + k) for k in ks}
    saved = spec.drafters, spec.priced, list(spec.price.samples)
    prompt = fresh_prompts(1, context, seed=77, vocab=(100, vocab - 1))[0]
    spec.drafters, spec.priced = {"fixed": CyclingDrafter(ks, vocab)}, False
    spec.price.samples.clear()
    # max(ks) + 2 more tokens: the last steps' room (max_tokens) would cut the drafts below k
    engine.add_request("curve", prompt, SamplingParams(max_tokens=rounds * len(ks) + max(ks) + 2, temperature=0.0,
                                                       ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    rows = {}
    for k in ks:
        got = [(u, t) for n, u, t in spec.price.samples if n == 1 + k] or [(0, float("nan"))]
        rows[k] = (statistics.median(t for _, t in got), predicted[k], statistics.median(u for u, _ in got))
    spec.drafters, spec.priced = saved[:2]
    spec.price.samples.clear()
    spec.price.samples.extend(saved[2])
    spec.price.theta = theta
    return rows


def reprobe(engine, threads: int) -> None:
    """The price's probe again, uncached, once the trace routes the MoE layers: the one at start
    timed the random routers' union, which a real model's routing is not (its clock as the
    engine's own probe takes it: verify_probe.clock_for)."""
    clock = time.thread_time if threads == 1 else time.perf_counter
    price = engine.spec.price
    if getattr(price, "probe", None) is None:
        return
    from freetoken.engine import verify_probe
    t = time.perf_counter()
    price.set_probe(verify_probe.measure(engine.runner, engine.blocks, engine.vocab_size,
                                         verify_probe.sizes_for(engine.spec.K), engine.max_model_len,
                                         engine.spec.observer, clock=clock))
    price.probe_note = f"measured again under the trace's routing ({time.perf_counter() - t:.2f} s)"


def print_probe(engine) -> None:
    """The verify price's measured prior (engine/verify_probe.py): where it came from and each
    size's median step over the 1-position step's."""
    price = engine.spec.price
    pr = getattr(price, "probe", None)      # (a tree before the probe: none)
    if pr is None:
        print(f"verify probe: none ({getattr(price, 'probe_note', 'not in this tree')})")
        return
    med = {int(n): statistics.median(pr[pr[:, 0] == n, 2]) for n in sorted(set(pr[:, 0].tolist()))}
    print(f"verify probe: {price.probe_note}; positions: ms (x 1 position): "
          + ", ".join(f"{n}: {t * 1e3:.2f} ({t / med[1]:.2f})" for n, t in med.items()))


def watch_lengths(speculator) -> Counter:
    """Counts (workload, drafter, k drafted, accepted) of every verify while `.on` names the
    workload (the auto runs)."""
    seen = Counter()
    seen.on, seen.last = None, 0        # last: the drafts of the latest verify (the lockstep's probe)
    verified = speculator.verified

    def count(draft, drafted, accepted):
        seen.last = drafted
        if seen.on:
            seen[(seen.on, draft.drafter, drafted, accepted)] += 1
        verified(draft, drafted, accepted)
    speculator.verified = count
    return seen


def print_lengths(seen: Counter) -> None:
    """Per workload, drafter and k the price chose: drafts, mean accepted, share fully accepted
    (the price cut a run that might have gone on), share of nothing accepted."""
    print("\nauto: workload drafter   k   drafts   mean accepted   all k accepted   none accepted")
    for w, d, k in sorted({(w, d, k) for w, d, k, _ in seen}):
        rows = [(a, n) for (ww, dd, kk, a), n in seen.items() if (ww, dd, kk) == (w, d, k)]
        n = sum(c for _, c in rows)
        print(f"  {w:6s} {d:8s} {k:3d} {n:8d} {sum(a * c for a, c in rows) / n:15.2f} "
              f"{sum(c for a, c in rows if a == k) / n:16.2f} {sum(c for a, c in rows if a == 0) / n:15.2f}")


def draft_checkpoint(spec: str, vocab: int) -> str:
    """`tiny`: a small dense Qwen3 with the medium model's tokenizer (cached), else the path."""
    if spec != "tiny":
        return spec
    from freetoken.tiny import make_tiny
    out = Path.home() / ".cache" / "freetoken" / "bench" / f"qwen3-dense-draft-{vocab}"
    if not (out / "config.json").exists():
        make_tiny("qwen3", out, layers=2, hidden=256, vocab=vocab, dtype="bfloat16", intermediate_size=768,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=65536)
    return str(out)


def target(args):
    """(checkpoint path, what it is, text -> ids, trace or None) for --model / --routing-trace."""
    if args.routing_trace:
        from freetoken.sim.readers import load_trace
        trace = load_trace(args.routing_trace)
        shape = dict(MEDIUM_QWEN3, experts=trace.num_experts, top_k=trace.top_k, layers=args.trace_layers)
        path = medium_checkpoint(name=f"qwen3-moe-medium-e{trace.num_experts}k{trace.top_k}l{args.trace_layers}",
                                 **shape)
        return (path, f"medium MoE {path.name} routed as {trace.model} ({trace.name}: {trace.num_layers} layers "
                f"spread over {args.trace_layers})", qwen2_encode(), trace)
    if args.model == "medium":
        path = medium_checkpoint()
        return path, f"medium MoE {path.name}", qwen2_encode(), None
    if args.model == "dense":
        path = medium_checkpoint("qwen3", "qwen3-dense-medium", **MEDIUM_DENSE)
        return path, f"medium dense Qwen3 {path.name} (random)", qwen2_encode(), None
    if args.model == "smollm2":
        from freetoken.default_model import installed_default, not_installed_hint
        path = installed_default()
        if path is None:
            sys.exit(not_installed_hint())
        return path, f"{path.name} (real weights, its own tokenizer)", None, None
    return Path(args.model), args.model, qwen2_encode(), None


def replay_lockstep(llm, speculator, turns, args, history, lengths) -> None:
    """The replay in lockstep: each turn's forced response decoded by plain and auto step by step
    in turn (every step timed; auto's turn ends in fewer steps), the drafters fresh each round and
    seeing the sessions' turns in order. Per round the pooled ratio; overall the median of the
    per-turn ratios and the pooled one."""
    from freetoken import SamplingParams
    per_turn, pooled = [], {"plain": [], "auto": []}
    clock = CLOCKS[args.clock]

    def drafted(name):          # the drafts the step just taken verified (0: a plain step)
        k, lengths.last = lengths.last, 0
        return k if name == "auto" else 0
    for r in range(args.rounds):
        speculator.drafters = fresh_drafters(history)
        sides = {"plain": None, "auto": speculator} if r % 2 == 0 else {"auto": speculator, "plain": None}
        got = {"plain": [], "auto": []}
        for i, (prompt, resp) in enumerate(turns):
            def params(resp=resp):
                return SamplingParams(max_tokens=len(resp), temperature=0.0, ignore_eos=True,
                                      logits_processors=[forced(resp)])
            lengths.on = "replay"
            steps, out = lockstep(llm.engine, sides, prompt, params, f"rp{r}{i}", tail=True, clock=clock,
                                  probe=drafted)
            lengths.on = None
            if len(set(map(tuple, out.values()))) != 1:
                sys.exit(f"replay turn {i}: auto's tokens differ from plain's")
            per_turn.append(rate(steps["auto"]) / rate(steps["plain"]))
            for name in got:
                got[name] += steps[name]
        for name in got:
            pooled[name] += got[name]
        print(f"  round {r} replay lockstep: auto / plain {rate(got['auto']) / rate(got['plain']):.3f}x "
              f"(plain {rate(got['plain']):.2f} tok/s)", flush=True)
    llm.engine.spec = speculator
    print(f"replay lockstep, auto / plain: pooled {rate(pooled['auto']) / rate(pooled['plain']):.3f}x, "
          f"per turn {summary(per_turn).replace('windows', 'turns')}")
    print_replay_costs(pooled)


def print_replay_costs(pooled: dict) -> None:
    """The auto side's replay steps by the drafts each verified: steps, share of auto's seconds,
    mean seconds over the plain side's mean step (the verify cost at the replay's own contexts)
    and tokens a step; then that cost per k as a --cost curve for bench/spec_bounds.py."""
    plain = statistics.mean(s[0] for s in pooled["plain"])
    total = sum(s[0] for s in pooled["auto"])
    by_k = {}
    for secs, toks, k in pooled["auto"]:
        by_k.setdefault(k, []).append((secs, toks))
    print("replay auto steps by drafts verified   steps   seconds share   cost (x plain step)   tokens/step")
    for lo, hi in ((0, 0), (1, 1), (2, 2), (3, 4), (5, 8), (9, 12), (13, 16), (17, 64)):
        got = [x for k in range(lo, hi + 1) for x in by_k.get(k, [])]
        if got:
            label = f"k = {lo}" if lo == hi else f"k = {lo}-{hi}"
            print(f"  {label:36s} {len(got):7d}   {sum(s for s, _ in got) / total:13.3f}   "
                  f"{statistics.mean(s for s, _ in got) / plain:19.3f}   {statistics.mean(t for _, t in got):11.2f}")
    print("replay cost per k (steps): " + ", ".join(
        f"{k}: {statistics.mean(s for s, _ in v) / plain:.3f} ({len(v)})" for k, v in sorted(by_k.items())))


def free_lockstep(llm, speculator, prompts, args, history, lengths) -> None:
    """The free-running rows in lockstep (bench/spec_lockstep.py): auto against plain and, with
    --control, plain against plain, per prompt and round, fresh drafters each lockstep."""
    from freetoken import SamplingParams

    def params():
        return SamplingParams(max_tokens=args.free_tokens, temperature=0.0, ignore_eos=True)
    pairs = [("auto", {"plain": None, "auto": speculator})]
    if args.control:
        pairs.append(("control", {"plain": None, "plain2": None}))
    got = {label: [] for label, _ in pairs}
    for r in range(args.rounds):
        for i, prompt in enumerate(prompts):
            for label, sides in pairs:
                if r % 2:                              # which side is prefilled and stepped first alternates
                    sides = dict(reversed(list(sides.items())))
                speculator.drafters = fresh_drafters(history)
                lengths.on = "free" if label == "auto" else None
                steps, out = lockstep(llm.engine, sides, prompt, params, f"ls{r}{i}", clock=CLOCKS[args.clock])
                lengths.on = None
                a, b = (steps[n] for n in sorted(steps, key=lambda n: n != "plain"))
                ratios = window_ratios(a, b, args.window)
                got[label] += ratios
                whole = (sum(n for _, n in b) / sum(t for t, _ in b)) / (sum(n for _, n in a) / sum(t for t, _ in a))
                same = len(set(map(tuple, out.values()))) == 1
                print(f"  round {r} prompt {i} {label:7s} {summary(ratios)}; whole run {whole:.3f}x; "
                      f"tokens identical {same}", flush=True)
    llm.engine.spec = speculator
    for label, ratios in got.items():
        name = "auto / plain" if label == "auto" else "control: plain / plain"
        print(f"free lockstep, {name}: {summary(ratios)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=768, help="keep the last N prompt tokens")
    ap.add_argument("--response", type=int, default=96, help="force the first N response tokens")
    ap.add_argument("--free", type=int, default=4)
    ap.add_argument("--free-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-draft", type=int, default=16)
    ap.add_argument("--draft-model", default=None, metavar="PATH|tiny",
                    help="add a --speculative draft column with this draft model")
    ap.add_argument("--host-cache-gib", type=float, default=None,
                    help="the disk tier with this host cache (the expert lookahead reads ahead into it)")
    ap.add_argument("--model", default="medium", metavar="medium|dense|smollm2|PATH",
                    help="medium: the random medium MoE; dense: a random medium dense Qwen3; smollm2: the real "
                         "default model (installed by ./ft)")
    ap.add_argument("--routing-trace", default=None, metavar="PATH",
                    help="route the MoE layers as this trace did (a medium MoE with its expert shape)")
    ap.add_argument("--trace-layers", type=int, default=4, help="MoE layers of the trace-shaped medium MoE")
    ap.add_argument("--curve-context", type=int, default=256, metavar="N",
                    help="the verify cost curve after a prompt of N tokens (the replay's steps run at 800-1600)")
    ap.add_argument("--offset", type=int, default=0, metavar="J",
                    help="replay the J-th session after each pick instead: sessions held out from tuning")
    ap.add_argument("--history", type=int, default=0, metavar="N",
                    help="the suffix index first sees N other recorded sessions (whole turns), as a server "
                         "that served them would have (0: each replay starts from an empty index)")
    ap.add_argument("--free-from", choices=("random", "sessions"), default="random",
                    help="free-running prompts: random ids, or the sessions' prompts (a real model's real acceptance)")
    ap.add_argument("--lockstep", action="store_true",
                    help="read the free-running rows in lockstep (median of per-window ratios) instead of in rounds")
    ap.add_argument("--window", type=int, default=16, help="--lockstep: step pairs per window ratio")
    ap.add_argument("--bf16-dot", default="auto", choices=("auto", "on", "off"),
                    help="bf16 weights x bf16-rounded activations (vdpbf16ps) in the kernels: calibrated, or forced")
    ap.add_argument("--decode-attention", default="auto", choices=("auto", "amx", "fp32"),
                    help="force decode attention over a bf16 cache onto AMX tiles or fp32 FMAs (auto: calibrated)")
    ap.add_argument("--clock", default="wall", choices=tuple(CLOCKS),
                    help="--lockstep: time each step by the wall clock or the process's CPU clock (use with --threads 1)")
    ap.add_argument("--control", action="store_true",
                    help="--lockstep: also plain against plain in the same lockstep (the method's noise floor)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from freetoken import LLM, SamplingParams
    from freetoken.engine.spec.ngram import NgramDrafter
    from freetoken.engine.spec.suffix import SuffixDrafter
    path, label, encode, trace = target(args)
    opts = dict(num_threads=args.threads, max_model_len=4096, spec_max_draft=args.max_draft,
                decode_attention=args.decode_attention, bf16_dot=args.bf16_dot)
    # one engine (two would not fit the memory rule): "plain" runs with its speculator detached
    if args.host_cache_gib:
        opts.update(expert_tier="disk", host_cache_gib=args.host_cache_gib)
    if args.draft_model:
        opts["draft_model"] = draft_checkpoint(args.draft_model, MEDIUM_VOCAB)
    llm = LLM(str(path), speculative="auto", **opts)
    if trace is not None:
        from freetoken.sim.trace_routing import TraceRouting
        TraceRouting(trace, llm.engine.model).install()
        reprobe(llm.engine, args.threads)
    speculator = llm.engine.spec
    draft = speculator.drafters.pop("draft", None)
    names = ("plain", "auto", "draft") if draft is not None else ("plain", "auto")
    vocab = llm.engine.vocab_size
    print(isa_line(args.threads))
    print_probe(llm.engine)
    print(f"{label}: threads {args.threads}, max draft {args.max_draft} (alternating rounds, medians)")
    turns, history = session_turns(args, encode or llm.tokenizer.encode, vocab)
    jobs = replay_jobs(turns)
    prompts = ([p for p, _ in turns[:args.free]] if args.free_from == "sessions" else
               fresh_prompts(args.free, 128, seed=5, vocab=(100, vocab - 1)))
    free = [(p, SamplingParams(max_tokens=args.free_tokens, temperature=0.0, ignore_eos=True)) for p in prompts]
    print(f"replay: {len(jobs)} turns, {sum(j[1].max_tokens for j in jobs)} forced tokens; "
          f"free: {len(free)} {args.free_from} prompts x {args.free_tokens} tokens; suffix history: "
          f"{args.history} other sessions ({sum(map(len, history))} tokens)")
    res = {(w, n): [] for w in ("replay", "free") for n in names}
    lengths = watch_lengths(speculator)
    works = [] if args.lockstep else [("replay", jobs)] * bool(jobs) + [("free", free)]
    for r in range(args.rounds):
        for work, js in works:
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                llm.engine.spec = None if name == "plain" else speculator
                # fresh drafters each run: an index that saw these responses in an earlier round
                # would draft them from memory (the statistics and the price carry over)
                speculator.drafters = {"draft": draft} if name == "draft" else fresh_drafters(history)
                lengths.on = work if name == "auto" else None
                secs, toks = decode_run(llm, js)
                lengths.on = None
                res[(work, name)].append(toks / secs)
                print(f"  round {r} {work:6s} {name:5s} {toks / secs:7.2f} tok/s ({toks} tokens)", flush=True)
    if args.lockstep:
        if turns:
            replay_lockstep(llm, speculator, turns, args, history, lengths)
        free_lockstep(llm, speculator, prompts, args, history, lengths)
    print("\nworkload   plain tok/s   auto tok/s   auto/plain" + ("   draft tok/s   draft/plain" if draft else ""))
    for work, _ in works:
        a, b = statistics.median(res[(work, "plain")]), statistics.median(res[(work, "auto")])
        line = f"{work:8s}   {a:11.2f}   {b:10.2f}   {b / a:9.3f}x"
        if draft is not None:
            c = statistics.median(res[(work, "draft")])
            line += f"   {c:11.2f}   {c / a:10.3f}x"
        # each round's auto against the plain run beside it (the machine's drift cancels in a pair)
        pairs = [x / y for x, y in zip(res[(work, "auto")], res[(work, "plain")])]
        print(line + f"   (per round: {', '.join(f'{x:.3f}' for x in pairs)})")
    llm.engine.spec = speculator
    speculator.drafters = {"suffix": SuffixDrafter(), "ngram": NgramDrafter()}
    st = llm.engine.expert_stats().get("speculative", {})
    if draft is not None:
        d = draft.summary()
        print(f"draft model {Path(opts['draft_model']).name}: {d['per_token_s'] * 1e3:.2f} ms a drafted token, "
              f"catch-up {d['catch_up_per_row_s'] * 1e3:.2f} ms a row, {d['positions_run']} positions run, "
              f"{d['rows_rolled_back']} rows rolled back")
    if "lookahead" in st:
        la = st["lookahead"]
        print(f"expert lookahead: {la['known_positions']}/{la['positions']} verify positions with known routing, "
              f"{la.get('prefetched', 0)} experts prefetched, {la.get('used', 0)} used, {la.get('wasted', 0)} wasted")
    for d, s in st.get("drafters", {}).items():
        print(f"drafter {d}: {s['drafts']} drafts, {s['proposed_tokens']} proposed, {s['accepted_tokens']} accepted, "
              f"mean accepted length {s['mean_accepted_length']:.2f}")
    print_lengths(lengths)
    if "price" in st:
        p = st["price"]
        print(f"price: step {p['step_s'] * 1e3:.2f} ms + {p['per_position_s'] * 1e3:.3f} ms/position + "
              f"{p['per_expert_s'] * 1e6:.2f} us/expert")
    ks = list(range(min(args.max_draft, 16) + 1))
    rows = cost_curve(llm, ks, vocab, context=args.curve_context)
    # pred/meas x k=0: each side over its own plain step (the load level of the price's last steps
    # and of this table's minutes apart: the shape the price gives each k)
    print("\nk   measured ms   predicted ms   pred/meas   pred/meas x k=0   experts/step   cost/plain")
    m0, p0, _ = rows[0]
    for k in ks:
        m, p, u = rows[k]
        print(f"{k:<3d} {m * 1e3:11.2f}   {p * 1e3:12.2f}   {p / m:9.2f}   {(p / p0) / (m / m0):15.2f}   {u:12.0f}   "
              f"{m / m0:9.2f}x")


if __name__ == "__main__":
    main()
