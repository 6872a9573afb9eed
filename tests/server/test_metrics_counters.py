"""Engine totals that only grow are Prometheus counters (rate() works on them), levels stay
gauges; read back with prometheus_client's own text parser."""
from prometheus_client.parser import text_string_to_metric_families

from freetoken.server.operations.metrics import ENGINE_COUNTERS, Metrics


def families(m: Metrics) -> dict:
    return {f.name: f for f in text_string_to_metric_families(m.render().decode())}


def test_prefix_totals_are_counters_and_levels_gauges():
    m = Metrics()
    m.engine_stats = {"prefix": {"hit_tokens": 96, "miss_tokens": 40, "cached_blocks": 7,
                                 "evicted_blocks": 2, "checkpoints": 1, "checkpoint_bytes": 4096,
                                 "evicted_checkpoints": 0, "restored_checkpoints": 3},
                      "total": {"hits": 5}}
    fam = families(m)
    for name in ("hit_tokens", "miss_tokens", "evicted_blocks", "evicted_checkpoints",
                 "restored_checkpoints"):
        f = fam[f"freetoken_engine_prefix_{name}"]
        assert f.type == "counter"
        assert f.samples[0].name == f"freetoken_engine_prefix_{name}_total"
    assert fam["freetoken_engine_prefix_hit_tokens"].samples[0].value == 96
    for name in ("cached_blocks", "checkpoints", "checkpoint_bytes"):
        assert fam[f"freetoken_engine_prefix_{name}"].type == "gauge"


def test_every_prefix_statistic_is_classified():
    """The counters named are exactly the prefix cache's own running totals (PrefixStats),
    so a new statistic is not silently a counter or a gauge by accident of its name."""
    from freetoken.engine.prefix.cache import PrefixStats
    totals = {f"prefix_{k}" for k in PrefixStats().__dict__}
    assert {c for c in ENGINE_COUNTERS if c.startswith("prefix_")} == totals
