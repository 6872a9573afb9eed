"""A fast, deterministic subset of bench/fuzz_api.py on the tiny model (real tokenizer, chat
template, grammar compiler): a few hundred seeded mutation cases over every route and the
admin route, each answered < 500 in its protocol's shape, 200s strict JSON, streams ended
by their final event; the server healthy with no 5xx counted. The long run is
`python bench/fuzz_api.py --cases 3000`."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def test_generator_is_deterministic():
    from fuzz_cases import generate
    a, b = generate(7, 300, "m"), generate(7, 300, "m")
    assert [(c.family, c.path, c.body, c.headers) for c in a] == [(c.family, c.path, c.body, c.headers) for c in b]
    assert len({c.family for c in a}) >= 15 and len({c.path.split("?")[0] for c in a}) >= 6


@pytest.mark.timeout(600)
def test_fuzz_subset_on_the_tiny_model():
    import fuzz_api
    from fuzz_cases import generate, probe_cases
    url, model, stop = fuzz_api.start_in_process("tiny")
    try:
        cases = [c for c in probe_cases(model) if len(c.body) < 2_000_000] + generate(3, 300, model)
        # timings are not asserted (shared machine): the bench reports them
        r = fuzz_api.run_cases(url, cases, case_limit=float("inf"))
    finally:
        stop()
    fuzz_api.print_report(r, "CI subset")
    assert r["cases"] >= 300
    assert r["ok"], r["problems"][:10]
    assert "500" not in r["by_status"] and r["by_status"].get("200", 0) > 20
