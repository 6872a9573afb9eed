"""`freetoken sim sessions`: replay recorded agent sessions through the engine's prefix
cache and report re-prefilled tokens against the prefix-only ideal, per checkpoint policy."""
from __future__ import annotations

import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from ...errors import FreeTokenError
from ...memory.plan import kv_block_count, kv_tokens_in
from .formats import SessionError
from .read import read_sessions
from .model_state import cache_shapes
from .replay import POLICIES, POLICY_NOTES, replay_session
from .tokens import render_session


def add_parser(sim_sub) -> None:
    p = sim_sub.add_parser("sessions", help="re-prefilled tokens of recorded agent sessions vs the prefix-only ideal")
    p.add_argument("--model", required=True, help="checkpoint folder (config.json; tokenizer unless --tokenizer)")
    p.add_argument("--sessions", required=True, nargs="+", help="session files or folders (agent-sessions formats)")
    p.add_argument("--state-checkpoints", type=int, default=16, help="state checkpoints kept per session (default 16)")
    p.add_argument("--state-cache-gib", type=float, default=8.0, help="all state checkpoints together (default 8, the engine's)")
    p.add_argument("--policies", default=",".join(POLICIES), help=f"comma list of {', '.join(POLICIES)} (default all)")
    p.add_argument("--tokenizer", help="a tokenizer folder or a GGUF vocabulary to use instead of the model's")
    p.add_argument("--chat-template", help="a .jinja chat template to use instead of the model's")
    p.add_argument("--chat-template-kwargs", default="{}", help="JSON object passed to the template")
    p.add_argument("--block-size", type=int, default=16, help="KV block size (default 16)")
    p.add_argument("--kv-cache-gib", type=float, help="KV budget (default: room for every session's tokens)")
    p.add_argument("--dtype", help="state/KV dtype for the byte counts (default: the checkpoint's)")
    p.add_argument("--summary", action="store_true", help="one row per session format instead of per session")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=run)


def kv_blocks(gib: float | None, kv_bytes_per_token: int, block_size: int) -> int:
    """KV blocks of the replayed pool, the null block included: the blocks the engine allocates
    for kv_cache_gib (memory/plan.py), so the replay gets the engine's usable blocks; None or 0:
    room for every session's tokens."""
    if not gib:
        return 1 << 20
    return max(2, kv_block_count(kv_tokens_in(gib, kv_bytes_per_token), block_size))


def _tokenizer(args):
    from ...tokenizer import Tokenizer
    src = Path(args.tokenizer or args.model)
    if src.suffix == ".gguf":
        from ...weights.gguf.tokenizer import save_tokenizer_dir
        src = save_tokenizer_dir(src, tempfile.mkdtemp(prefix="freetoken-tok-"))
    tok = Tokenizer(src)
    if args.chat_template:
        try:
            tok.chat_template = Path(args.chat_template).read_text()
        except OSError as e:
            raise SessionError(f"{args.chat_template}: cannot read ({e.strerror})") from None
    return tok


def run(args) -> int:
    from ...engine.prefix.anchors import AnchorFinder
    try:
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        bad = [p for p in policies if p not in POLICIES]
        if bad or not policies:
            raise SessionError(f"--policies: expected a comma list of {', '.join(POLICIES)}, got {args.policies!r}")
        try:
            kwargs = json.loads(args.chat_template_kwargs)
            assert isinstance(kwargs, dict)
        except (ValueError, AssertionError):
            raise SessionError(f"--chat-template-kwargs: expected a JSON object, got {args.chat_template_kwargs!r}") from None
        shapes = cache_shapes(args.model, args.dtype)
        tok = _tokenizer(args)
        anchors = AnchorFinder.from_tokenizer(tok)
        sessions = read_sessions(args.sessions)
        if not sessions:
            raise SessionError("no sessions with requests in " + " ".join(args.sessions))
        kw = dict(anchors=anchors, state_bytes=shapes["state_bytes"], block_size=args.block_size,
                  num_blocks=kv_blocks(args.kv_cache_gib, shapes["kv_bytes_per_token"], args.block_size),
                  state_checkpoints=args.state_checkpoints,
                  state_cache_gib=args.state_cache_gib)
        results = []
        for i, s in enumerate(sessions):
            if not args.json:
                print(f"\r[{i + 1}/{len(sessions)}] {s.name[:60]:60}", end="", file=sys.stderr, flush=True)
            results.append(replay_session(s.name, s.format, render_session(tok, s, kwargs), policies=policies, **kw))
        if not args.json:
            print("\r" + " " * 80 + "\r", end="", file=sys.stderr)
    except (SessionError, FreeTokenError, RuntimeError) as e:
        print(f"freetoken sim sessions: error: {e}", file=sys.stderr)
        return 2
    report = _report(args, shapes, policies, results)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(format_table(report, summary=args.summary))
    return 0


def _totals(rows: list[dict], policies) -> dict:
    t = {"sessions": len(rows), "requests": sum(r["requests"] for r in rows),
         "prompt_tokens": sum(r["prompt_tokens"] for r in rows), "ideal": sum(r["ideal"] for r in rows),
         "policies": {}}
    for p in policies:
        comp = sum(r["policies"][p]["computed"] for r in rows)
        t["policies"][p] = {"computed": comp, "ratio": comp / max(1, t["ideal"]),
                            "worst_ratio": max(r["policies"][p]["ratio"] for r in rows),
                            "checkpoints": max(r["policies"][p]["checkpoints"] for r in rows),
                            "checkpoint_bytes": max(r["policies"][p]["peak_checkpoint_bytes"] for r in rows)}
    return t


def _report(args, shapes, policies, results) -> dict:
    rows = []
    for r in results:
        rows.append({"session": r.name, "format": r.format, "requests": r.requests, "prompt_tokens": r.prompt_tokens,
                     "output_tokens": r.output_tokens, "ideal": r.ideal,
                     "policies": {p: {"computed": pr.computed, "cached": pr.cached, "ratio": r.ratio(p),
                                      "checkpoints": pr.checkpoints, "checkpoint_bytes": pr.checkpoint_bytes,
                                      "peak_checkpoint_bytes": pr.peak_checkpoint_bytes}
                                  for p, pr in r.policies.items()}})
    groups = defaultdict(list)
    for row in rows:
        groups[row["format"]].append(row)
    return {"model": str(args.model), "kind": shapes["kind"], "state_bytes": shapes["state_bytes"],
            "state_checkpoints": args.state_checkpoints, "policies": policies,
            "policy_notes": {p: POLICY_NOTES[p] for p in policies}, "sessions": rows,
            "formats": {f: _totals(g, policies) for f, g in groups.items()}, "total": _totals(rows, policies)}


def _mib(b: int) -> str:
    return f"{b / 2**20:.1f}"


def format_table(report: dict, summary: bool = False) -> str:
    pols = report["policies"]
    head = f"{'session':34} {'reqs':>5} {'prompt':>9} {'ideal':>8}"
    for p in pols:
        head += f" | {p + ' re-prefill':>18} {'ratio':>6} {'ckpt':>4} {'MiB':>6}"
    lines = [f"model {report['model']} ({report['kind']}, state snapshot {_mib(report['state_bytes'])} MiB, "
             f"<= {report['state_checkpoints']} checkpoints per session)",
             *(f"  {p}: {n}" for p, n in report["policy_notes"].items()), "", head, "-" * len(head)]

    def row(name, reqs, prompt, ideal, pol, ck_key):
        s = f"{name[:34]:34} {reqs:>5} {prompt:>9} {ideal:>8}"
        for p in pols:
            d = pol[p]
            s += f" | {d['computed']:>18} {d['ratio']:>6.3f} {d['checkpoints']:>4} {_mib(d[ck_key]):>6}"
        return s

    if not summary:
        for r in report["sessions"]:
            lines.append(row(r["session"], r["requests"], r["prompt_tokens"], r["ideal"], r["policies"],
                             "peak_checkpoint_bytes"))
        lines.append("-" * len(head))
    for f, t in report["formats"].items():
        lines.append(row(f"[{f}: {t['sessions']} sessions]", t["requests"], t["prompt_tokens"], t["ideal"],
                         t["policies"], "checkpoint_bytes"))
    t = report["total"]
    lines.append(row("TOTAL", t["requests"], t["prompt_tokens"], t["ideal"], t["policies"], "checkpoint_bytes"))
    worst = ", ".join(f"{p} {t['policies'][p]['worst_ratio']:.3f}" for p in pols)
    lines.append(f"worst session ratio: {worst}; ratio = re-prefilled / ideal; ckpt/MiB: checkpoints live at "
                 "the end (group rows: the largest session's peak)")
    return "\n".join(lines)
