"""`freetoken sim cache|project` through register(), on synthetic and real traces."""

import json

import pytest

from freetoken.experts.memory.slots import DEFAULT_POLICY
from freetoken.sim.policies import POLICIES
from freetoken.experts.measure.trace_format import TraceWriter


@pytest.fixture
def engine_trace(tmp_path):
    path = tmp_path / "run.jsonl"
    with TraceWriter(path, {"num_layers": 2, "num_experts": 8, "top_k": 2, "model": "tiny", "expert_bytes": 1 << 20}) as w:
        for layer in range(2):
            w.write("prefill", 0, layer, [[0, 1], [2, 3], [1, 2]])
        for step in range(1, 40):
            for layer in range(2):
                w.write("decode", step, layer, [[step % 5, (step * 3) % 8]])
    return path


def test_cache_table(run_sim, engine_trace):
    code, out, err = run_sim("cache", "--trace", str(engine_trace), "--capacity", "0.25,0.5", "--policy", "all")
    assert code == 0 and err == ""
    assert "0.25 (4 slots)" in out and "0.5 (8 slots)" in out
    for name in POLICIES:
        assert any(line.startswith(name + " ") for line in out.splitlines())


def test_cache_json_echoes_capacity(run_sim, engine_trace):
    code, out, _ = run_sim("cache", "--trace", str(engine_trace), "--capacity", "0.25,3", "--policy", "lru,belady", "--json")
    results = json.loads(out)["results"]
    assert code == 0
    assert [(r["policy"], r["capacity"], r["slots"]) for r in results] == [("lru", 0.25, 4), ("lru", 3, 3), ("belady", 0.25, 4), ("belady", 3, 3)]
    assert all(r["accesses"] == 39 * 2 * 2 - sum(1 for s in range(1, 40) if s % 5 == (s * 3) % 8) * 2 for r in results)
    assert all(0 <= r["miss_rate"] <= 1 for r in results)


def test_cache_plot(run_sim, engine_trace, tmp_path):
    png = tmp_path / "curve.png"
    code, _, _ = run_sim("cache", "--trace", str(engine_trace), "--capacity", "0.1,0.3", "--policy", "lru,arc", "--plot", str(png))
    assert code == 0 and png.read_bytes()[:4] == b"\x89PNG"


def test_project_table_and_json(run_sim, engine_trace):
    code, out, _ = run_sim("project", "--trace", str(engine_trace), "--hardware", "rtx4060-laptop")
    assert code == 0 and "q* / max(all-fill, all-cpu)" in out
    code, out, _ = run_sim("project", "--trace", str(engine_trace), "--hardware", "rtx5090-desktop", "--json", "--capacity", "0.5")
    data = json.loads(out)
    assert code == 0 and data["hardware"] == "rtx5090-desktop"
    assert {r["split"] for r in data["results"]} >= {"all-fill", "all-cpu", "fixed", "q*"}
    assert data["speedup"][0]["capacity"] == 0.5


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["cache", "--trace", "/no/such/trace.jsonl"], "/no/such/trace.jsonl"),
        (["cache", "--trace", "{trace}", "--policy", "mru"], "mru"),
        (["cache", "--trace", "{trace}", "--capacity", "2.5"], "capacity"),
        (["project", "--trace", "{trace}", "--hardware", "cray-1"], "cray-1"),
        (["cache", "--trace", "{trace}", "--policy", "lru", "--plot", "/no/such/dir/x.png"], "/no/such/dir/x.png"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(run_sim, engine_trace, argv, needle):
    code, out, err = run_sim(*[a.replace("{trace}", str(engine_trace)) for a in argv])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and needle in err


def test_project_without_expert_size_asks_for_it(run_sim, tmp_path):
    path = tmp_path / "nosize.jsonl"
    with TraceWriter(path, {"num_layers": 1, "num_experts": 4, "top_k": 1, "model": "x"}) as w:
        w.write("decode", 0, 0, [[1]])
    code, _, err = run_sim("project", "--trace", str(path), "--hardware", "rtx5090-desktop")
    assert code == 2 and "--expert-bytes" in err
    code, out, _ = run_sim("project", "--trace", str(path), "--hardware", "rtx5090-desktop", "--expert-bytes", "1e6")
    assert code == 0


# one test per trace: each runs every policy at two capacities (minutes on a loaded 2-core machine)
@pytest.mark.parametrize("trace", ["qwen3-30b-a3b/qwen.route.csv", "gpt-oss-120b/gptoss.route.csv",
                                   "mixtral-8x7b-instruct-fp8/routing_raw.jsonl"])
def test_real_traces_run_and_belady_is_never_beaten(run_sim, traces_dir, trace):
    code, out, _ = run_sim("cache", "--trace", str(traces_dir / trace), "--json")
    assert code == 0
    results = json.loads(out)["results"]
    for cap in (0.11, 0.37):
        rates = {r["policy"]: r["miss_rate"] for r in results if r["capacity"] == cap}
        assert set(rates) == set(POLICIES)
        # prefetching policies load ahead of use: outside the model belady bounds
        ahead = lambda p: "prefetch" in (DEFAULT_POLICY if p == "default" else p)  # noqa: E731
        assert min(r for p, r in rates.items() if not ahead(p)) == rates["belady"]
        on_use = [p for p in ("lru", "lfu", "lrfu", "arc", "default", "lru+layer", "lrfu+admit+layer") if not ahead(p)]
        assert rates["belady-on-use"] <= min(rates[p] for p in on_use)


def test_module_entry_point(engine_trace, capsys):
    from freetoken.sim.__main__ import main

    assert main(["cache", "--trace", str(engine_trace), "--policy", "lrfu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["results"][0]["policy"] == "lrfu"
