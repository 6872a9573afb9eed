"""bench/gpu_check.sh and its Python part: the script says so and exits 0 without a GPU, and the
measuring code runs end to end in its dry mode (`--device cpu --tiny`) so it is not untested."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU branch")
def test_script_without_a_gpu_prints_one_line_and_exits_0(tmp_path):
    r = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), str(tmp_path / "out")], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHON": sys.executable})
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip().splitlines()) == 1 and "no CUDA device" in r.stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(1200)
def test_dry_run_writes_json_and_markdown(tmp_path):
    gpu_check = _load()
    assert gpu_check.main(["--device", "cpu", "--tiny", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "gpu_check.json").read_text())
    backends = {(r["backend"], r["cache_fraction"]) for r in res["decode"]}
    assert backends == {("cpu", None), ("hybrid", 0.3), ("offload", 0.3)}
    assert all(r["decode_tok_s"] > 0 for r in res["decode"])
    assert set(res["prefill"]["tok_s"]) == {"on", "off"} and res["prefill"]["prompt_tokens"] == 64
    assert res["profile"]["b_p_gbs"] > 0 and 0 < res["profile"]["q_star_over_m"] <= 1
    assert res["cold_start_s"] > 0 and res["peak_host_gib"] > 0
    md = (tmp_path / "gpu_check.md").read_text()
    assert "| hybrid | 30% |" in md and "double buffering" in md


def test_dry_run_decodes_through_the_graph_runner(tmp_path):
    """The graphs on/off rows: on the CPU the runner's buckets and padding run with the eager
    capture, and every decode step of the "on" engine was a replay."""
    gpu_check = _load()
    import random
    from freetoken.tiny import make_tiny
    model = make_tiny("qwen3_moe", tmp_path / "m", layers=2, experts=8, top_k=2, dtype="bfloat16")
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    res = gpu_check.graphs_decode(model, torch.device("cpu"), vocab, 3, 1, random.Random(0))
    assert set(res["tok_s"]) == {"1", "4"} and res["disabled"] is None
    assert res["replays"] > 0 and all(v["on"] > 0 and v["off"] > 0 for v in res["tok_s"].values())
