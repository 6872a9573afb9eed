"""Damaged and hostile model files, each run through the real CLI (`freetoken generate`):
every one must end with ONE line on stderr, exit code 2, within --timeout seconds (5).

    PYTHONPATH=. python bench/bad_files.py            # all cases
    PYTHONPATH=. python bench/bad_files.py --only rope_theta,fifo
    PYTHONPATH=. python bench/bad_files.py --in-process      # one interpreter (loaded machine)

Cases: each size field of config.json set to 0 / -1 / 10^9 / 10^12 / a float / a string /
a bool / a list / a 40-digit int; rope_theta and rms_norm_eps non-positive or non-finite; a
config nested 100k deep, a 5000-digit integer, not JSON, not an object, empty; a FIFO as
config.json or model.safetensors; truncated or garbage safetensors; tokenizer files broken;
chat templates that recurse, reach for __class__, render 300 MB or loop for ever; a
5000-character --model; FTW headers claiming 2^62 bytes or re-signed with 10^9 experts;
GGUF alignment 0 or 3."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZE_FIELDS = ["num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size",
               "intermediate_size", "moe_intermediate_size", "num_experts", "num_experts_per_tok",
               "vocab_size", "max_position_embeddings", "head_dim"]
BAD_INTS = [0, -1, 10**9, 10**12, 1e9, "sixty-four", True, [], 10**40]
BAD_FLOATS = {"rope_theta": [-1, 0, float("nan"), float("inf"), "x"],
              "rms_norm_eps": [float("nan"), 0, -1, 2, float("inf")]}
TEMPLATES = {
    "template_recursion": "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}",
    "template_class": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "template_globals": "{{ cycler.__init__.__globals__.os.system('true') }}",
    "template_300mb": "{{ 'x' * 300000000 }}",
    "template_300mb_loop": "{% for i in range(100000) %}{{ 'y' * 3000 }}{% endfor %}",
    "template_spin": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "template_syntax": "{% for %}",
    "template_raises_at_render": "{{ 1 / 0 }}",
    "template_not_string": 42,
}


def _config_case(key, value):
    def make(d: Path) -> Path:
        cfg = json.loads((d / "config.json").read_text())
        cfg[key] = value
        (d / "config.json").write_text(json.dumps(cfg))
        return d
    return make


def _write(name, text: str | bytes):
    def make(d: Path) -> Path:
        p = d / name
        p.unlink(missing_ok=True)
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
        return d
    return make


def _fifo(name):
    def make(d: Path) -> Path:
        (d / name).unlink(missing_ok=True)
        os.mkfifo(d / name)
        return d
    return make


def _template(tpl):
    def make(d: Path) -> Path:
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        cfg["chat_template"] = tpl
        (d / "tokenizer_config.json").write_text(json.dumps(cfg))
        (d / "chat_template.jinja").unlink(missing_ok=True)
        return d
    return make


def _nested(d: Path) -> Path:
    (d / "config.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    return d


def _digits(d: Path) -> Path:
    text = (d / "config.json").read_text()
    (d / "config.json").write_text(text.replace('"hidden_size": 64', '"hidden_size": ' + "9" * 5000))
    return d


def _truncate(name, keep):
    def make(d: Path) -> Path:
        data = (d / name).read_bytes()
        (d / name).write_bytes(data[:keep(len(data))])
        return d
    return make


def _long_model(d: Path) -> Path:
    return Path("/tmp/" + "m" * 5000)


def _ftw(mutate):
    def make(d: Path) -> Path:
        from freetoken.weights.ftw.format import MAGIC, PREAMBLE
        src = _ftw_file(d)
        data = bytearray(src.read_bytes())
        magic, version, flags, size, digest = PREAMBLE.unpack_from(data)
        out = d.parent / "bad.ftw"
        out.write_bytes(mutate(data, (magic, version, flags, size, digest)))
        return out
    return make


_FTW_CACHE: dict[str, Path] = {}


def _ftw_file(d: Path) -> Path:
    key = str(d.parent.parent)
    if key not in _FTW_CACHE:
        from freetoken.loading.convert import convert
        out = d.parent.parent / "tiny.ftw"
        convert(d, out)
        _FTW_CACHE[key] = out
    return _FTW_CACHE[key]


def _ftw_size(data, pre):
    from freetoken.weights.ftw.format import PREAMBLE
    magic, version, flags, size, digest = pre
    PREAMBLE.pack_into(data, 0, magic, version, flags, 1 << 62, digest)
    return bytes(data)


def _ftw_resign(edit):
    def mutate(data, pre):
        from xxhash import xxh3_64_intdigest

        from freetoken.weights.ftw.format import PREAMBLE, config_hash
        magic, version, flags, size, digest = pre
        body = data[PREAMBLE.size:PREAMBLE.size + size]
        header = json.loads(body)
        edit(header["config"])
        header["config_hash"] = config_hash(header["config"])
        new = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        end = PREAMBLE.size + max(size, len(new))
        if any(data[PREAMBLE.size + size:end]):        # grow only into the zero padding
            raise RuntimeError(f"re-signed header grew past its padding: {len(new)} > {size}")
        data[PREAMBLE.size:end] = new + b"\0" * (end - PREAMBLE.size - len(new))
        PREAMBLE.pack_into(data, 0, magic, version, flags, len(new), xxh3_64_intdigest(new))
        return bytes(data)
    return mutate


def _gguf(alignment):
    def make(d: Path) -> Path:
        import gguf
        import numpy as np
        p = d.parent / "bad.gguf"
        w = gguf.GGUFWriter(str(p), "qwen3moe")
        w.add_block_count(1)
        w.add_embedding_length(32)
        w.add_uint32("general.alignment", alignment)
        w.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return p
    return make


def cases() -> dict[str, object]:
    out = {}
    for f in SIZE_FIELDS:
        for v in BAD_INTS:
            out[f"{f}={v!r}"[:60]] = _config_case(f, v)
    for f, vals in BAD_FLOATS.items():
        for v in vals:
            out[f"{f}={v!r}"] = _config_case(f, v)
    out.update({
        "config_nested_100k": _nested, "config_5000_digits": _digits,
        "config_not_json": _write("config.json", "{not json"), "config_list": _write("config.json", "[1]"),
        "config_empty": _write("config.json", ""), "config_binary": _write("config.json", b"\xff\xfe\x00"),
        "config_fifo": _fifo("config.json"), "safetensors_fifo": _fifo("model.safetensors"),
        "safetensors_truncated": _truncate("model.safetensors", lambda n: n // 2),
        "safetensors_header_only": _truncate("model.safetensors", lambda n: 8),
        "safetensors_garbage": _write("model.safetensors", b"\x00" * 64),
        "tokenizer_garbage": _write("tokenizer.json", "{}"),
        "tokenizer_not_json": _write("tokenizer.json", "nope"),
        "tokenizer_not_utf8": _write("tokenizer.json", b'{"version": "\xff"}'),
        "tokenizer_config_not_utf8": _write("tokenizer_config.json", b'{"eos_token": "\xed\xb3\xbf"}'),
        "tokenizer_config_not_json": _write("tokenizer_config.json", "{"),
        "generation_config_not_json": _write("generation_config.json", "{"),
        "long_model_name": _long_model,
        "ftw_header_2^62": _ftw(_ftw_size),
        "ftw_num_experts_1e9": _ftw(_ftw_resign(lambda c: c.update(num_experts=10**9))),
        "ftw_layers_1e9": _ftw(_ftw_resign(lambda c: c.update(num_hidden_layers=10**9))),
        "ftw_heads_0": _ftw(_ftw_resign(lambda c: c.update(num_attention_heads=0))),
        "ftw_truncated": _ftw(lambda data, pre: bytes(data[:len(data) // 2])),
        "gguf_alignment_0": _gguf(0), "gguf_alignment_3": _gguf(3),
    })
    for name, tpl in TEMPLATES.items():
        out[name] = _template(tpl)
    return out


def tiny_dir(root: Path) -> Path:
    from freetoken.tiny import make_tiny
    return make_tiny("qwen3_moe", root / "tiny")


def run_case(name, make, tiny: Path, work: Path, timeout: float, in_process: bool = False) -> tuple[bool, str]:
    d = work / "m"
    if d.exists():
        shutil.rmtree(d)
    shutil.copytree(tiny, d)
    (work / "bad.ftw").unlink(missing_ok=True)
    model = make(d)
    argv = ["generate", "--model", str(model), "--prompt", "hi", "--max-tokens", "2", "--chat"]
    t0 = time.monotonic()
    if in_process:           # the same entry point, without a fresh interpreter (and torch import) each
        import contextlib
        import io
        import logging

        from freetoken.cli import main as cli_main
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                rc = cli_main(argv)
            except SystemExit as e:
                rc = e.code
            except BaseException as e:  # noqa: BLE001 - a traceback is a failed case
                rc = f"raised {type(e).__name__}: {str(e)[:100]}"
        logging.getLogger().handlers.clear()
        dt = time.monotonic() - t0
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        ok = rc == 2 and len(lines) == 1
        return ok, f"exit {rc}, {len(lines)} stderr lines, {dt:.2f} s: {(lines or [''])[-1][:150]}"
    cmd = [sys.executable, "-m", "freetoken.cli", *argv]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout * 3,
                           env={**os.environ, "PYTHONWARNINGS": "ignore", "TQDM_DISABLE": "1"})
    except subprocess.TimeoutExpired:
        return False, f"hung (> {timeout * 3:.0f} s)"
    dt = time.monotonic() - t0
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    ok = p.returncode == 2 and len(lines) == 1 and dt <= timeout
    return ok, f"exit {p.returncode}, {len(lines)} stderr lines, {dt:.1f} s: {(lines or [''])[-1][:150]}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help="comma-separated substrings of case names")
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--in-process", action="store_true",
                    help="call freetoken.cli.main in this process (no per-case interpreter start)")
    args = ap.parse_args(argv)
    allc = cases()
    chosen = {k: v for k, v in allc.items()
              if not args.only or any(s in k for s in args.only.split(","))}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tiny = tiny_dir(root)
        work = root / "work"
        work.mkdir()
        good = 0
        for name, make in chosen.items():
            ok, what = run_case(name, make, tiny, work, args.timeout, args.in_process)
            good += ok
            print(f"[{'PASS' if ok else 'FAIL'}] {name}: {what}", flush=True)
    print(f"bad files: {good}/{len(chosen)} one line, exit 2, within {args.timeout:g} s")
    return 0 if good == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
