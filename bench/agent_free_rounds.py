"""Per-round table of a free-running long session (bench/agents_e2e.sh --free): a real
`freetoken serve` model writes every reply itself; the bench sends one new user message per
round through the agent's continue mode. Read from the server's log and the bench's rounds
file, it prints every request of every round (prompt tokens, cached tokens, TTFT) and checks
what an unattended session needs: every round ran without the agent erroring out, the history
shrank at least once (the agent compacted and went on), and the prefix cache served the
history (a round's first request found at least 90% of the previous round's last prompt
cached; rounds next to a compaction or an agent error excepted).

A compaction is seen from outside as the conversation getting shorter: the last request of a
round (the agent's main conversation) is smaller than the last request of the round before.

Usage: python bench/agent_free_rounds.py SERVER_LOG ROUNDS_FILE
  ROUNDS_FILE lines: "ROUND RC FIRST_REQUEST LAST_REQUEST_EXCLUSIVE SECONDS" (request indices
  count completed requests in SERVER_LOG). Exit status 0 when every check passes.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

DONE = re.compile(r"req=(\S+) \w+ prompt=(\d+) cached=(\d+) completion=(\d+) ttft=([\d.]+)s .*finish=(\w+)")
OVERFLOW = re.compile(r"-> 400 (.*(?:maximum context length|prompt is too long).*)")


def requests(log: Path) -> list[dict]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if m := DONE.search(line):
            rid, prompt, cached, comp, ttft, finish = m.groups()
            out.append(dict(id=rid, prompt=int(prompt), cached=int(cached), out=int(comp),
                            ttft=float(ttft), finish=finish, overflows=0))
        elif OVERFLOW.search(line):
            out.append(dict(id="overflow", prompt=0, cached=0, out=0, ttft=0.0, finish="400", overflows=1))
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("log")
    p.add_argument("rounds_file")
    args = p.parse_args()
    reqs = requests(Path(args.log))
    served = [r for r in reqs if r["id"] != "overflow"]
    rows = [list(map(float, ln.split())) for ln in Path(args.rounds_file).read_text().splitlines() if ln.strip()]
    print(f"   {'round':>5} {'rc':>3} {'req':>4} {'prompt':>8} {'cached':>8} {'ttft_s':>7} {'out':>5} "
          f"{'finish':<10} note")
    failed, compactions, cache_ok, cache_rounds, prev_last, prev_clean = [], 0, 0, 0, None, False
    for rnd, rc, first, last, secs in rows:
        rnd, rc, first, last = int(rnd), int(rc), int(first), int(last)
        mine = served[first:last]
        if rc != 0 or not mine:
            failed.append(rnd)
        shrank = prev_last is not None and mine and mine[-1]["prompt"] < prev_last
        compactions += bool(shrank)
        for i, r in enumerate(mine):
            note = ""
            if i == 0 and prev_last is not None:
                note = f"cached/previous history {r['cached'] / prev_last:.2f}"
                if not shrank and prev_clean:    # the round before ran and kept its history
                    cache_rounds += 1
                    cache_ok += r["cached"] >= 0.9 * prev_last
            if shrank and i == len(mine) - 1:
                note += ("; " if note else "") + f"history shrank {prev_last} -> {r['prompt']}: compacted"
            print(f"   {rnd if i == 0 else '':>5} {rc if i == 0 else '':>3} {first + i + 1:>4} {r['prompt']:>8} "
                  f"{r['cached']:>8} {r['ttft']:>7.3f} {r['out']:>5} {r['finish']:<10} {note}")
        if not mine:
            print(f"   {rnd:>5} {rc:>3}    - no request completed")
        print(f"         round {rnd}: rc={rc}, {len(mine)} requests, {secs:.0f} s")
        if mine:
            prev_last = mine[-1]["prompt"]
        prev_clean = rc == 0 and bool(mine) and not shrank
    overflows = sum(r["overflows"] for r in reqs)
    checks = {f"all {len(rows)} rounds ran without the agent erroring out"
              + (f" (failed: {failed})" if failed else ""): not failed,
              f"compacted and went on ({compactions}x; {overflows} overflow replies)": compactions > 0,
              f"prefix cache served the history ({cache_ok}/{cache_rounds} rounds >= 90%)":
                  cache_rounds > 0 and cache_ok == cache_rounds}
    for name, ok in checks.items():
        print(f"   {'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
