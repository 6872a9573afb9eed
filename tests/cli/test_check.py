"""`freetoken check` runs its whole sequence on a tiny model and diagnoses in the guide's terms."""
from freetoken.cli import main as cli_main
from freetoken.cli.check import diagnose
from freetoken.memory.plan import MemoryPlan


def test_check_runs_every_step(tiny_dir, capsys):
    src = str(tiny_dir("qwen3_moe"))
    assert cli_main(["check", "--model", src, "--dtype", "float32", "--prompt-tokens", "40", "--max-tokens", "4",
                     "--seconds", "0.05", "--moe-backend", "offload", "--expert-cache-slots", "4"]) == 0
    out = capsys.readouterr().out
    for part in ("== memory plan", "B_P", "== start", "== cold request", "== warm request", "== diagnosis"):
        assert part in out
    assert "expert hit rate" in out


def _req(ttft, cached=0, hit=None, fill=0.0):
    return {"ttft_s": ttft, "decode_tok_s": 10.0, "hit_rate": hit, "cached_tokens": cached, "fill_s": fill, "cpu_s": 0}


def test_diagnosis_rules():
    plan = MemoryPlan(available={"host": 1})
    lines = diagnose(plan, 30.0, False, 1.0, _req(2.0), _req(1.9), None, "cpu")
    assert any(line.startswith("startup delay") and "FTW" in line for line in lines)
    assert any("re-prefill" in line for line in lines)
    lines = diagnose(plan, 1.0, True, 1.0, _req(2.0, fill=1.5), _req(1.9, cached=100, hit=0.2), None, "hybrid")
    assert any("transfers" in line for line in lines) and any("misses" in line for line in lines)
    assert diagnose(plan, 1.0, True, 1.0, _req(2.0), _req(0.1, cached=100), None, "cpu")[-1] == "no problem found"


def test_check_roofline_reports_limits_and_shares(tiny_dir, capsys):
    """--roofline: the machine's limits, the model's phases against them, the requests' shares;
    without --model the machine alone."""
    src = str(tiny_dir("qwen3_moe", dtype="bfloat16"))
    assert cli_main(["check", "--model", src, "--prompt-tokens", "40", "--max-tokens", "4", "--seconds", "0.05",
                     "--roofline"]) == 0
    out = capsys.readouterr().out
    for part in ("== roofline: read", "peak GFLOP/s fp32", "attention projections", "experts (top-2 of 8)",
                 "limits: decode <=", "== roofline share: prefill", "of the read bandwidth"):
        assert part in out, part
    assert cli_main(["check", "--roofline"]) == 0
    out = capsys.readouterr().out
    assert "== roofline: read" in out and "== memory plan" not in out
    from freetoken import kernels
    from freetoken.kernels.gemm import modes_here
    lib = kernels.load()
    if lib is not None and "amx" in modes_here(lib):     # the prefill tiles' own loop, where they run
        assert "== roofline: AMX prefill tile loop, one thread" in out and "x in L2" in out, out
