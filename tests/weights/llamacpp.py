"""llama.cpp's converter, fetched once from PyPI (the llama-cpp-python sdist ships it) into
~/.cache/freetoken/llamacpp, run on a checkpoint directory."""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

VERSION = "0.3.36"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "freetoken" / "llamacpp"
KEEP = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


class Unavailable(Exception):
    """The sdist cannot be fetched (no PyPI): the GGUF tests skip with this reason."""


def llama_cpp_source() -> Path:
    """vendor/llama.cpp of the sdist (converter + conversion/ + gguf-py/), downloaded if needed."""
    root = CACHE / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"
    if (root / "convert_hf_to_gguf.py").is_file() and (root / "gguf-py").is_dir():
        return root
    sdist = CACHE / "sdist" / f"llama_cpp_python-{VERSION}.tar.gz"
    if not sdist.is_file():
        got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                              f"llama-cpp-python=={VERSION}", "-d", str(sdist.parent)],
                             capture_output=True, text=True)
        if got.returncode or not sdist.is_file():
            raise Unavailable(f"llama-cpp-python {VERSION} sdist not downloadable from PyPI: {got.stderr.strip()[-300:]}")
    prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)
                   and m.name[len(prefix):].startswith(KEEP)]
        tar.extractall(CACHE, members=members, filter="data")
    return root


def convert(src: Path, model_dir: Path, out: Path, outtype: str = "f32", *extra: str) -> Path:
    script = Path(__file__).with_name("llamacpp_convert.py")
    run = subprocess.run([sys.executable, str(script), str(src), str(model_dir), "--outtype", outtype,
                          "--outfile", str(out), *extra], capture_output=True, text=True)
    assert run.returncode == 0, f"llama.cpp converter failed on {model_dir}:\n{run.stderr[-3000:]}"
    return out
