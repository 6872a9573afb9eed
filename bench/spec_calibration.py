"""How well the acceptance statistics predict the drafts of bench/speculative.py's replay:
log-loss and calibration of predicted against observed acceptance, model-free and deterministic.

    PYTHONPATH=. .venv/bin/python bench/spec_calibration.py [--sessions 2] [--turns 6] [--prompt 768]
        [--response 96] [--history 20] [--offset 0] [--max-draft 16]

The same turns as bench/spec_bounds.py (the same picks, --offset j for held-out ones). At every
position of every response both drafters propose (their buckets refined by agreement, as the
engine's); each proposal's per-token rates are read from the statistics before its outcome is
known and then the statistics learn it (every proposal scored at its full length, so the
buckets are compared on the same events, not on the ones a price happened to pick). Printed per
drafter and pass (the statistics carried into the second, as the bound's): token events (token i
of a draft whose tokens before it were accepted), their log-loss in nats, the first token's
log-loss, and the first token's calibration by predicted probability. Run it in two trees to
compare their buckets: a lower log-loss is a bucket that tells accepted drafts from rejected ones."""
from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from spec_bounds import VOCAB, accepted  # noqa: E402
from speculative import fresh_drafters, qwen2_encode, session_turns  # noqa: E402

from freetoken.engine.spec.acceptance import AcceptanceStats  # noqa: E402
from freetoken.engine.spec.drafters import with_agreement  # noqa: E402

BINS = (0.2, 0.4, 0.6, 0.8, 1.01)


def score(turns, history, stats: AcceptanceStats, K: int) -> dict:
    """One pass: per drafter [events, log-loss, first events, first log-loss] and first-token
    calibration rows {bin: [n, predicted sum, accepted]}."""
    drafters = fresh_drafters(history)
    out = defaultdict(lambda: [0, 0.0, 0, 0.0])
    cal = defaultdict(lambda: defaultdict(lambda: [0, 0.0, 0]))
    for t, (prompt, resp) in enumerate(turns):
        for pos in range(len(resp)):
            ctx, room = prompt + resp[:pos], min(K, len(resp) - pos - 1)
            drafts = []
            for d in drafters.values():
                d.observe(t, ctx, 0)
                if room > 0 and (dr := d.propose(ctx, room, key=t)) is not None:
                    drafts.append(dr)
            for dr in with_agreement(drafts):
                n = accepted(dr, resp, pos)
                rates, row = stats.rates(dr.drafter, dr.bucket), out[dr.drafter]
                for i in range(min(n + 1, len(dr.tokens))):
                    p = min(max(rates[i], 1e-6), 1 - 1e-6)
                    loss = -math.log(p if i < n else 1 - p)
                    row[0] += 1
                    row[1] += loss
                    if i == 0:
                        row[2] += 1
                        row[3] += loss
                        c = cal[dr.drafter][next(b for b in BINS if p < b)]
                        c[0] += 1
                        c[1] += p
                        c[2] += n > 0
                stats.observe_shadow(dr.drafter, dr.bucket, len(dr.tokens), n)
        for d in drafters.values():
            d.observe(t, prompt + resp, 0)
            d.forget(t)
    return {"loss": dict(out), "calibration": {k: dict(v) for k, v in cal.items()}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=2)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--prompt", type=int, default=768)
    ap.add_argument("--response", type=int, default=96)
    ap.add_argument("--history", type=int, default=20, help="other sessions the suffix index sees first")
    ap.add_argument("--offset", type=int, default=0, help="the j-th session after each pick (held out)")
    ap.add_argument("--max-draft", type=int, default=16)
    args = ap.parse_args()
    turns, history = session_turns(args, qwen2_encode(), VOCAB)
    stats = AcceptanceStats(args.max_draft)
    print(f"sessions {args.sessions} (offset {args.offset}), turns {args.turns}, response {args.response}, "
          f"history {args.history}, max draft {args.max_draft}")
    for p in (1, 2):
        r = score(turns, history, stats, args.max_draft)
        for name, (n, loss, n1, loss1) in sorted(r["loss"].items()):
            cal = r["calibration"][name]
            bins = "  ".join(f"<{b:.1f}: {c[1] / c[0]:.2f}/{c[2] / c[0]:.2f} ({c[0]})"
                             for b, c in sorted(cal.items()))
            print(f"pass {p} {name:7s} token events {n:6d} log-loss {loss / n:.4f}   first token {n1:5d} "
                  f"log-loss {loss1 / n1:.4f}   P(first) predicted/observed (n): {bins}")


if __name__ == "__main__":
    main()
