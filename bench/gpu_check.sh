#!/usr/bin/env bash
# The one-call GPU check (issue 23): CUDA tests, then the medium model's decode / prefill /
# profile / start-up / memory figures as JSON + markdown in $OUT (or the folder given).
# Finishes within 8 minutes on one GPU; without a GPU it says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
DEST=${1:-${OUT:-bench-gpu-check}}
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check: no CUDA device (torch.cuda.is_available() is False); nothing to check"
    exit 0
fi
mkdir -p "$DEST"
timeout 240 "$PY" -m pytest -m cuda tests -q -p no:cacheprovider 2>&1 | tee "$DEST/pytest_cuda.txt" | tail -5 || true
PYTHONPATH=. timeout 330 "$PY" bench/gpu_check.py --out "$DEST"
