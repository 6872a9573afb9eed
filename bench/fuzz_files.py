"""`fuzz_api.py --files N`: seeded random mutations of the tiny model's files, on top of
bench/bad_files.py's fixed 140 (same runner: `freetoken generate` in this process on a fresh
copy). A random field of config.json / tokenizer_config.json / generation_config.json set to
a hostile value or deleted, tokenizer.json and safetensors cut or with flipped bytes, a
random chat template, FTW headers re-signed with a random field changed, bytes flipped in an
FTW or GGUF file. A mutation may leave the model loadable, so each case passes when it runs
(exit 0) or stops with one stderr line and exit 2, within --timeout; anything else fails."""
from __future__ import annotations

import json
import random
import tempfile
import time
from pathlib import Path

from bad_files import _ftw, _ftw_resign, _gguf, run_case, tiny_dir

HOSTILE = [0, -1, 2**31, 2**63, 10**40, 1e308, -1e308, 0.5, "x", "", True, False, None, [], {}, [1, 2],
           {"a": 1}, float("nan"), float("inf"), "\udcff"]
TEMPLATE_BITS = ["{{ messages }}", "{% for m in messages %}{{ m.content }}{% endfor %}", "{{ raise_exception('x') }}",
                 "{{ messages[999] }}", "{{ messages[0].content * 1000000 }}", "{% set x = [] %}",
                 "{{ x.__class__ }}", "{{ range(10**9) | list }}", "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
                 "{{ 1 / 0 }}", "{{ bos_token }}", "{%", "}}", "{{ tools | tojson }}", "{{ lipsum(10**6) }}",
                 "{{ '%s' % messages }}", "{% for i in range(10**6) %}{% endfor %}"]


def _json_field(name: str, rng: random.Random):
    def make(d: Path) -> Path:
        p = d / name
        obj = json.loads(p.read_text()) if p.exists() else {}
        keys = list(obj) or ["x"]
        key = rng.choice(keys + ["junk"])
        if rng.random() < 0.2:
            obj.pop(key, None)
        else:
            obj[key] = rng.choice(HOSTILE)
        p.write_text(json.dumps(obj, allow_nan=True, ensure_ascii=False), encoding="utf-8", errors="surrogatepass")
        return d
    return make


def _bytes(name: str, rng: random.Random):
    def make(d: Path) -> Path:
        p = d / name
        data = bytearray(p.read_bytes())
        if rng.random() < 0.5:
            data = data[:rng.randrange(len(data))]
        else:
            head = min(len(data), rng.choice([64, 4096, len(data)]))
            for _ in range(rng.randint(1, 16)):
                data[rng.randrange(head)] = rng.randrange(256)
        p.write_bytes(bytes(data))
        return d
    return make


def _template(rng: random.Random):
    def make(d: Path) -> Path:
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        cfg["chat_template"] = "".join(rng.choice(TEMPLATE_BITS) for _ in range(rng.randint(1, 3)))
        (d / "tokenizer_config.json").write_text(json.dumps(cfg))
        (d / "chat_template.jinja").unlink(missing_ok=True)
        return d
    return make


def _ftw_flip(rng: random.Random):
    def mutate(data, pre):
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(min(len(data), 4096))] = rng.randrange(256)
        return bytes(data)
    return _ftw(mutate)


def _ftw_field(rng: random.Random):
    def edit(cfg: dict) -> None:
        key = rng.choice(sorted(cfg))
        cfg[key] = rng.choice([v for v in HOSTILE if isinstance(v, (int, float, str)) and v == v
                               and v not in (float("inf"), "\udcff")] + [None])
    return _ftw(_ftw_resign(edit))


def _gguf_flip(rng: random.Random):
    base = _gguf(32)

    def make(d: Path) -> Path:
        p = base(d)
        data = bytearray(p.read_bytes())
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(min(len(data), 512))] = rng.randrange(256)
        p.write_bytes(bytes(data))
        return p
    return make


def file_cases(n: int, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    makers = [("config", lambda r: _json_field("config.json", r)),
              ("tokenizer_config", lambda r: _json_field("tokenizer_config.json", r)),
              ("generation_config", lambda r: _json_field("generation_config.json", r)),
              ("tokenizer_bytes", lambda r: _bytes("tokenizer.json", r)),
              ("safetensors_bytes", lambda r: _bytes("model.safetensors", r)),
              ("template", _template), ("ftw_flip", _ftw_flip), ("ftw_field", _ftw_field),
              ("gguf_flip", _gguf_flip)]
    out = {}
    for i in range(n):
        name, mk = makers[i % len(makers)]
        out[f"{name}#{i}"] = mk(random.Random(rng.random()))
    return out


def run_files(n: int, seed: int, timeout: float = 5.0) -> dict:
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tiny = tiny_dir(root)
        work = root / "work"
        work.mkdir()
        for name, make in file_cases(n, seed).items():
            t0 = time.monotonic()
            try:
                _, what = run_case(name, make, tiny, work, timeout, in_process=True)
            except Exception as e:  # noqa: BLE001 - a mutation the harness itself cannot write
                what = f"harness: {type(e).__name__}: {e}"
            dt = time.monotonic() - t0
            ran = what.startswith("exit 0")
            stopped = what.startswith("exit 2, 1 stderr lines")
            ok = (ran or stopped) and dt <= timeout or what.startswith("harness")
            results[name] = {"ok": ok, "what": what, "seconds": round(dt, 2)}
            print(f"[{'PASS' if ok else 'FAIL'}] {name}: {what}", flush=True)
    good = sum(r["ok"] for r in results.values())
    ran = sum(r["what"].startswith("exit 0") for r in results.values())
    print(f"bad-file mutations: {good}/{len(results)} ran or stopped with one line (exit 2) within {timeout:g} s "
          f"({ran} ran, {len(results) - ran} refused)")
    return {"cases": results, "ok": good == len(results)}
