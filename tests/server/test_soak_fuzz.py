"""CI-sized runs of the soak and the fuzz benches, with the same end-of-run checks: every
request accounted for, no 5xx, KV back to idle, bounded RSS; every fuzz case < 500 and in
its protocol's shape. The long runs are `python bench/soak.py` / `python bench/fuzz.py`."""
import asyncio
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))


@pytest.mark.timeout(300)
def test_short_soak(tmp_path, monkeypatch):
    import soak
    monkeypatch.setenv("FREETOKEN_BENCH_CACHE", str(tmp_path))
    args = soak.parse_args(["--clients", "8", "--duration", "25", "--warmup", "8",
                            "--rss-growth-pct", "10", "--max-running", "4", "--sample-every", "2"])
    r = asyncio.run(soak.run(args))
    soak.print_report(r)
    assert r["ok"], r["checks"]
    assert r["outcomes"].get("completed", 0) > 0 and r["outcomes"].get("cancelled", 0) >= 0


@pytest.mark.timeout(300)
def test_bounded_fuzz():
    import fuzz
    from live_server import LiveServer, MODEL_NAMES, make_fake
    _, svc, app = make_fake(max_body_bytes=1 << 20)
    srv = LiveServer(app)
    try:
        r = fuzz.run(srv.url, fuzz.fuzz_schema(app, MODEL_NAMES), cases=25, seed=1, grammar=False)
    finally:
        srv.stop()
    assert r["generated_cases"] >= 200
    assert r["ok"], r["problems"][:10]
