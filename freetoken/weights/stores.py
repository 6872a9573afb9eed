"""`--model` resolution: where a model name points on this machine, found offline.

Accepted, in this order:
  a path: an HF checkpoint directory, an FTW file, a .gguf file, any part of a split GGUF
      (`NAME-00002-of-00003.gguf` resolves to part 1, which holds the metadata);
  an Ollama model `NAME[:TAG]` or `NAMESPACE/NAME[:TAG]` (tag "latest" by default), read
      from ~/.ollama/models (OLLAMA_MODELS overrides): its manifest's model layer blob;
  a Hugging Face repo id `ORG/NAME`, from the HF hub cache (HF_HUB_CACHE, else
      HF_HOME/hub, else ~/.cache/huggingface/hub): the snapshot refs/main names, else the
      newest snapshot.
Nothing is downloaded; a name found nowhere is a one-line error listing where we looked."""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import CheckpointError

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
        if not p.exists():
            return None
    except OSError as e:
        raise CheckpointError(f"{spec[:100]}: cannot look up this path ({e.strerror or e})") from None
    if p.is_file() and p.suffix == ".gguf":
        from .gguf import split_parts
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


def _gguf_in(d: Path) -> Path | None:
    """A snapshot with GGUF files and no config.json: its only model (or first split part)."""
    if (d / "config.json").is_file():
        return None
    ggufs = sorted(p for p in d.glob("*.gguf") if "-of-" not in p.name or "-00001-of-" in p.name)
    if len(ggufs) > 1:
        raise CheckpointError(f"{d}: holds several GGUF files ({', '.join(p.name for p in ggufs)}); "
                              "pass the one to serve as --model")
    return ggufs[0] if ggufs else None


def resolve_model(spec: str | os.PathLike) -> str:
    """The local path `spec` names (unchanged when it is a path that exists)."""
    s = str(spec)
    p = _path(s)
    if p is not None:
        return str(p)
    looked = [f"path {Path(s).expanduser()}"]
    found = _ollama(s, looked) or _hf_cache(s, looked)
    if found is not None and found.is_dir():
        found = _gguf_in(found) or found
    if found is None:
        raise CheckpointError(f"model {s!r} not found; looked in: {'; '.join(looked)}")
    return str(found)
