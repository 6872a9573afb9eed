"""make_plan's every output (settings, items, warnings, table) on every make-tiny architecture under a
grid of machines and options, to one JSON file: run it at two commits and compare the files to show a
change to memory/plan.py keeps the plan's numbers (7920 plans, ~517k values).

    python tools/plan_snapshot.py /tmp/before.json    # at the old commit (or PYTHONPATH=<old tree>)
    python tools/plan_snapshot.py /tmp/after.json
    cmp /tmp/before.json /tmp/after.json
"""
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from freetoken.tiny import ARCHS, make_tiny
from freetoken.config import EngineConfig
from freetoken.memory.model_size import read_model_shape
from freetoken.memory.plan import make_plan
from freetoken.memory.probe import GiB, MachineMemory
from freetoken.experts.memory import pinning
pinning.memlock_limit = lambda: None
root = Path(tempfile.gettempdir()) / "freetoken-plan-snapshot"; root.mkdir(parents=True, exist_ok=True)
out = {}
for arch in sorted(ARCHS):
    d = root / arch
    if not (d / "config.json").exists():
        try:
            make_tiny(arch, d)
        except Exception as e:
            print("skip", arch, e); continue
    shape = read_model_shape(d)
    grid = []
    for dev in ("cpu", "cuda"):
        for free in (0.02, 0.05, 0.1, 0.3, 0.5, 1.0, 2.6, 64):
            for opts in ({}, dict(max_model_len=10**6, kv_cache_gib=64, max_num_batched_tokens=8192),
                         dict(kv_cache_gib=0.0001), dict(moe_backend="hybrid", expert_cache_slots=4),
                         dict(expert_cache_gib=0.01, state_cache_gib=1.0), dict(moe_backend="resident"),
                         dict(expert_tier="disk"), dict(host_cache_gib=0.001), dict(max_num_seqs=16, max_model_len=4096),
                         dict(state_cache_gib=0.001, prefix_cache=True), dict(expert_format="int8")):
                try:
                    cfg = EngineConfig(model=str(d), device=dev, dtype="float32", **opts)
                except Exception as e:
                    grid.append(("cfg-error", str(e))); continue
                total = int(free * GiB)
                for frac in ((1, 0.3, 0.03, 0.01) if dev == "cuda" else (1,)):
                  dfree = int(free * frac * GiB) if dev == "cuda" else None
                  m = MachineMemory(max(total, 4 * GiB) if frac != 1 else total, total, "t", dfree, dfree)
                  try:
                    s, plan = make_plan(cfg, shape, m)
                    sd = {f.name: repr(getattr(s, f.name)) for f in dataclasses.fields(s) if f.name != "plan"}
                    grid.append((plan.to_json(), sd, plan.table(), plan.kv_blocks))
                  except Exception as e:
                    grid.append(("error", type(e).__name__, str(e)))
    out[arch] = grid
json.dump(out, open(sys.argv[1], "w"), indent=0, default=str)
def count(x):
    if isinstance(x, dict): return sum(count(v) for v in x.values())
    if isinstance(x, (list, tuple)): return sum(count(v) for v in x)
    return 1
print("values", count(out))
