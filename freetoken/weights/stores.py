"""`--model` resolution: where a model name points on this machine, found offline.

Accepted, in this order:
  a path: an HF checkpoint directory, an FTW file, a .gguf file, any part of a split GGUF
      (`NAME-00002-of-00003.gguf` resolves to part 1, which holds the metadata);
  an Ollama model `NAME[:TAG]` or `NAMESPACE/NAME[:TAG]` (tag "latest" by default), read
      from ~/.ollama/models (OLLAMA_MODELS overrides): its manifest's model layer blob;
  a Hugging Face repo id `ORG/NAME` or `ORG/NAME:QUANT`, from the HF hub cache (HF_HUB_CACHE,
      else HF_HOME/hub, else ~/.cache/huggingface/hub): the snapshot refs/main names, else the
      newest snapshot; with `:QUANT` (Q4_K_M, Q8_0 ...) the snapshot's GGUF of that quantization.
Nothing is downloaded here (`freetoken pull` does that, hub/); a name found nowhere is a
one-line error listing where we looked."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ..errors import CheckpointError
from .gguf.reader import split_parts
from .partial import check_not_partial

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"


def hf_hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface" / "hub"


def ollama_models_dir() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models")


MAX_SPEC_CHARS = 4096      # PATH_MAX


def _path(spec: str) -> Path | None:
    if len(spec) > MAX_SPEC_CHARS:
        raise CheckpointError(f"--model is {len(spec)} characters long; a path or model name has "
                              f"at most {MAX_SPEC_CHARS}")
    p = Path(spec).expanduser()
    try:
        check_not_partial(p)
        if not p.exists():
            return None
    except OSError as e:
        raise CheckpointError(f"{spec[:100]}: cannot look up this path ({e.strerror or e})") from None
    if p.is_file() and p.suffix == ".gguf":
        return split_parts(p)[0]
    return p


def _ollama(spec: str, looked: list[str]) -> Path | None:
    name, _, tag = spec.partition(":")
    if not name or "/" in tag or name.count("/") > 1:
        return None
    path = name if "/" in name else f"library/{name}"
    manifest = ollama_models_dir() / "manifests" / "registry.ollama.ai" / path / (tag or "latest")
    looked.append(f"Ollama manifest {manifest}")
    if not manifest.is_file():
        return None
    try:
        layers = json.loads(manifest.read_text()).get("layers") or []
        digest = next(layer["digest"] for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_LAYER)
    except (ValueError, KeyError, StopIteration, AttributeError, TypeError):
        raise CheckpointError(f"{manifest}: no layer of mediaType {OLLAMA_MODEL_LAYER} with a digest "
                              "(not an Ollama model manifest?)") from None
    blob = ollama_models_dir() / "blobs" / digest.replace(":", "-")
    if not blob.is_file():
        raise CheckpointError(f"{manifest}: its model blob {blob} is missing (re-run `ollama pull {spec}`)")
    return blob


def _hf_cache(spec: str, looked: list[str]) -> Path | None:
    spec = spec.partition(":")[0]
    parts = spec.split("/")
    if len(parts) != 2 or not all(parts):
        return None
    repo = hf_hub_cache() / f"models--{parts[0]}--{parts[1]}"
    looked.append(f"Hugging Face cache {repo}")
    snaps = repo / "snapshots"
    if not snaps.is_dir():
        return None
    ref = repo / "refs" / "main"
    if ref.is_file() and (snaps / ref.read_text().strip()).is_dir():
        return snaps / ref.read_text().strip()
    found = sorted((d for d in snaps.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime)
    return found[-1] if found else None


def quant_in(path: str, quant: str) -> bool:
    """Whether a GGUF file's path names quantization `quant` (Q4_K is not Q4_K_M)."""
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9_])", path, re.I) is not None


def _gguf_in(d: Path, quant: str | None = None) -> Path | None:
    """A snapshot with GGUF files and no config.json: its only model (or first split part);
    with `quant`, the one whose path names that quantization (subfolders too)."""
    if (d / "config.json").is_file() and not quant:
        return None
    ggufs = sorted(p for p in d.rglob("*.gguf") if "-of-" not in p.name or "-00001-of-" in p.name)
    if quant:
        ggufs = [p for p in ggufs if quant_in(str(p.relative_to(d)), quant)]
        if not ggufs:
            raise CheckpointError(f"{d}: no GGUF file of quantization {quant} (run `freetoken pull` for it)")
    if len(ggufs) > 1:
        raise CheckpointError(f"{d}: holds several GGUF files ({', '.join(str(p.relative_to(d)) for p in ggufs)}); "
                              "name the quantization (ORG/NAME:Q4_K_M) or pass the file as --model")
    return ggufs[0] if ggufs else None


def resolve_model(spec: str | os.PathLike) -> str:
    """The local path `spec` names (unchanged when it is a path that exists)."""
    s = str(spec)
    p = _path(s)
    if p is not None:
        return str(p)
    looked = [f"path {Path(s).expanduser().absolute()}"]
    found = _ollama(s, looked) or _hf_cache(s, looked)
    if found is not None and found.is_dir():
        quant = (s.partition(":")[2] or None) if "/" in s else None      # ORG/NAME:QUANT
        found = _gguf_in(found, quant) or found
    if found is None:
        raise CheckpointError(f"model {s!r} not found; looked in: {'; '.join(looked)}")
    return str(found)
