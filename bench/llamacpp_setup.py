"""llama.cpp for the side-by-side benches: a cached llama-cpp-python venv and GGUF conversion.

llama-cpp-python runs in this interpreter when it has it (`pip install -e .[bench]`, built from
its sdist, ~13 min on 2 cores, with the machine's AVX-512/BF16 paths); otherwise first use
installs it into a cached venv under ~/.cache/freetoken/llamacpp. GGUF conversion uses the
sdist's own convert_hf_to_gguf.py with its vendored gguf-py (unpacked in that cache).
Home-made tokenizers are mapped to the "qwen2" BPE pre-tokenizer."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from common import CACHE

LLAMA_DIR = CACHE.parent / "llamacpp"
VERSION = "0.3.36"


def _sdist_source() -> Path:
    """The unpacked sdist's vendored llama.cpp (its converter and gguf-py), downloaded once."""
    src = LLAMA_DIR / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"
    if not (src / "convert_hf_to_gguf.py").exists():
        LLAMA_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                        f"llama-cpp-python=={VERSION}", "-d", str(LLAMA_DIR / "sdist")], check=True)
        subprocess.run(["tar", "xzf", str(LLAMA_DIR / "sdist" / f"llama_cpp_python-{VERSION}.tar.gz"),
                        "-C", str(LLAMA_DIR)], check=True)
    return src


def ensure_llamacpp() -> tuple[Path, Path]:
    """(python that imports llama_cpp, convert_hf_to_gguf.py)."""
    here = Path(sys.executable)
    if subprocess.run([here, "-c", "import llama_cpp"], capture_output=True).returncode == 0:
        return here, _sdist_source() / "convert_hf_to_gguf.py"
    py = LLAMA_DIR / "venv" / "bin" / "python"
    ok = py.exists() and subprocess.run([py, "-c", "import llama_cpp"], capture_output=True).returncode == 0
    if not ok:
        print("installing llama-cpp-python (one-off, several minutes) ...", flush=True)
        src = _sdist_source()
        steps = [
            [sys.executable, "-m", "venv", str(LLAMA_DIR / "venv")],
            [py, "-m", "pip", "install", "-q", "numpy", "torch==2.13.0", "safetensors", "sentencepiece", "transformers"],
            [py, "-m", "pip", "install", "-q", str(LLAMA_DIR / "sdist" / f"llama_cpp_python-{VERSION}.tar.gz")],
        ]
        for s in steps:
            subprocess.run(s, check=True)
        return py, src / "convert_hf_to_gguf.py"
    return py, _sdist_source() / "convert_hf_to_gguf.py"


CONVERT = textwrap.dedent("""
    import sys, runpy
    sys.path.insert(0, {gguf_py!r}); sys.path.insert(0, {src!r})
    import convert_hf_to_gguf as c
    try:
        from conversion.base import TextModel          # llama.cpp after the converter split
    except ImportError:
        TextModel = c.TextModel
    orig = TextModel.get_vocab_base_pre
    def pre(self, tokenizer):
        try:
            return orig(self, tokenizer)
        except NotImplementedError:
            return "qwen2"          # home-made byte-level BPE: same pre-tokenizer as Qwen2
    TextModel.get_vocab_base_pre = pre
    sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[1:]
    c.main()
""")


def to_gguf(py: Path, converter: Path, model_dir: Path, outtype: str) -> Path:
    out = model_dir.parent / f"{model_dir.name}-{outtype}.gguf"
    if not out.exists():
        script = CONVERT.format(gguf_py=str(converter.parent / "gguf-py"), src=str(converter.parent))
        subprocess.run([py, "-c", script, str(model_dir), "--outtype", outtype, "--outfile", str(out)], check=True)
    return out
