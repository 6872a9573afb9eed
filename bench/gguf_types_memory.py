"""Resident memory of GGUF files in llama.cpp's quantizer mixes, as FreeToken loads them: the
process's memory above a bare engine vs the file's size, and the expert pool vs the file's
expert bytes (issue 33: types without a kernel used to be dequantized to float banks at load).

    PYTHONPATH=. .venv/bin/python bench/gguf_types_memory.py FILE.gguf [FILE.gguf ...]

Each file loads in its own subprocess (its memory its own): "bare" is the RSS after importing
FreeToken, torch and the C kernels; "loaded" after `LLM(file)` (the CPU backend, every
tensor kept as the file has it); both VmRSS (anonymous + file-backed pages). Prints, per file,
the ggml types of its expert tensors, pool / file expert bytes, (loaded - bare) / file size, and
whether the loader warned that it dequantized anything."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def child(path: str) -> dict:
    import gc
    import logging

    from freetoken import LLM, kernels
    from freetoken.quant import ggml_quants as gq
    from freetoken.weights.gguf.reader import GgufFile
    kernels.cpu_kernels()
    gc.collect()
    bare = rss()
    warned = []

    class Catch(logging.Handler):
        def emit(self, record):
            if "dequantiz" in record.getMessage():
                warned.append(record.getMessage())
    logging.getLogger("freetoken").addHandler(Catch())
    llm = LLM(path, dtype="bfloat16", moe_backend="cpu", num_threads=2, max_model_len=256)
    gc.collect()
    loaded = rss()
    ck = GgufFile(path)
    exps = [t for n, (_, t) in ck.tensors_by_name.items() if "_exps." in n]
    types = sorted({gq.NAMES.get(t.ggml_type, str(t.ggml_type)) for t in exps})
    out = {"types": types, "expert_file": sum(t.nbytes for t in exps), "pool": llm.engine.model.pool.nbytes,
           "file": Path(path).stat().st_size, "above_bare": loaded - bare, "warned": bool(warned)}
    llm.close()
    return out


def main():
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(sys.argv[2])))
        return
    print(f"{'file':40}{'expert types':28}{'pool/file experts':>18}{'RSS above bare/file':>21}  dequantized?")
    for path in sys.argv[1:]:
        r = subprocess.run([sys.executable, __file__, "--child", path], capture_output=True, text=True)
        if r.returncode:
            print(f"{Path(path).name:40}failed: {r.stderr.strip().splitlines()[-1]}")
            continue
        d = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"{Path(path).name:40}{','.join(d['types']):28}{d['pool'] / d['expert_file']:17.3f}x"
              f"{d['above_bare'] / d['file']:20.3f}x  {'yes' if d['warned'] else 'no'}", flush=True)


if __name__ == "__main__":
    main()
