"""bench/python_overhead.py (issue 38: the decode step's fixed cost) runs as a script on tiny
models and reports every case; no timing is asserted (CI machines are shared)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_overhead_bench_runs():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "python_overhead.py"), "--layers", "2", "--tokens", "4",
                        "--rounds", "2", "--models", "moe,dense"], capture_output=True, text=True, timeout=600,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    for label in ("moe resident", "moe cpu", "dense llama"):
        line = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith(label))
        assert "ms/step" in line and "3 steps" in line, line
