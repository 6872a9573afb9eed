"""Per-request table of one long agent session, read from the scripted server's log, and
the checks that the session did what a long unattended run must: every round, at least one
compaction (or an overflow the agent recovered from by compacting), and, for Claude Code,
sub-agents that ran at the same time.

Usage: python bench/agent_rounds.py SERVER_LOG --rounds 13 [--subagents] [--stdout AGENT_STDOUT]
Exit status 0 when every check passes.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

SCRIPT = re.compile(r"script req=(\S+) kind=(\w+) round=(\d+)")
DONE = re.compile(r"req=(\S+) \w+ prompt=(\d+) completion=(\d+) ttft=([\d.]+)s .*finish=(\w+)")
CACHED = re.compile(r"cached=(\d+)")
OVERFLOW = re.compile(r"-> 400 (.*(?:maximum context length|prompt is too long).*)")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("log")
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--subagents", action="store_true")
    p.add_argument("--stdout", default=None)
    args = p.parse_args()
    kinds: dict[str, tuple[str, int]] = {}
    open_subs, max_subs, compactions, overflows = set(), 0, 0, 0
    print(f"   {'#':>3} {'request':<12} {'round':>5} {'prompt':>8} {'cached':>7} {'ttft_s':>7} "
          f"{'out':>5} finish")
    n = 0
    for line in Path(args.log).read_text(errors="replace").splitlines():
        if m := SCRIPT.search(line):
            kinds[m.group(1)] = (m.group(2), int(m.group(3)))
            if m.group(2) == "subagent":
                open_subs.add(m.group(1))
                max_subs = max(max_subs, len(open_subs))
        elif m := DONE.search(line):
            rid, prompt, out, ttft, finish = m.groups()
            kind, rnd = kinds.get(rid, ("?", 0))
            open_subs.discard(rid)
            compactions += kind == "compaction"
            c = CACHED.search(line)
            n += 1
            print(f"   {n:>3} {kind:<12} {rnd or '':>5} {prompt:>8} {c.group(1) if c else '-':>7} "
                  f"{float(ttft):>7.3f} {out:>5} {finish}")
        elif m := OVERFLOW.search(line):
            overflows += 1
            print(f"       overflow -> 400: {m.group(1)[:110]}")
    done = args.stdout and f"All done: {args.rounds} rounds read." in Path(args.stdout).read_text(
        errors="replace")
    checks = {f"finished all {args.rounds} rounds": bool(done),
              f"compacted ({compactions}x; {overflows} overflow replies)": compactions > 0}
    if args.subagents:
        checks[f"sub-agents at once (max {max_subs})"] = max_subs >= 2
    for name, ok in checks.items():
        print(f"   {'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
