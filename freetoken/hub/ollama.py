"""Ollama library models (`qwen3:30b-a3b`, `library/qwen3:30b-a3b`, `NAMESPACE/NAME:TAG`) from
the registry's two routes the way `ollama pull` stores them:

    GET {registry}/v2/{ns}/{name}/manifests/{tag}   (Accept: docker manifest v2)
    GET {registry}/v2/{ns}/{name}/blobs/sha256:<hex> (redirected to a CDN)

into OLLAMA_MODELS (default ~/.ollama/models): `blobs/sha256-<hex>` for the config and every
layer, then `manifests/registry.ollama.ai/{ns}/{name}/{tag}` (the manifest as sent), written
last and atomically, so a store never names a blob that is not complete and verified.
FREETOKEN_OLLAMA_REGISTRY (or --registry) points at a mirror; it is stored under
registry.ollama.ai all the same, which is where `--model NAME` and Ollama itself look."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import httpx

from ..errors import PullError
from ..progress import progress
from ..weights.stores import OLLAMA_MODEL_LAYER, ollama_models_dir
from .download import (Digest, check_space, client, fetch, http_error, missing_bytes, replace_atomically,
                       unreachable)

DEFAULT_REGISTRY = "https://registry.ollama.ai"
MANIFEST_ACCEPT = "application/vnd.docker.distribution.manifest.v2+json"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_PART = re.compile(r"[a-z0-9][a-z0-9._-]*", re.I)


def parse_name(spec: str) -> tuple[str, str, str]:
    """(namespace, name, tag): `qwen3` -> (library, qwen3, latest)."""
    path, _, tag = spec.partition(":")
    parts = path.split("/")
    if len(parts) == 1:
        parts = ["library", *parts]
    tag = tag or "latest"
    if len(parts) != 2 or not all(_PART.fullmatch(p) for p in (*parts, tag)):
        raise PullError(f"{spec!r} is not an Ollama model name (NAME[:TAG] or NAMESPACE/NAME[:TAG])")
    return parts[0], parts[1].lower(), tag


def registry_url(registry: str | None = None) -> str:
    return (registry or os.environ.get("FREETOKEN_OLLAMA_REGISTRY") or DEFAULT_REGISTRY).rstrip("/")


def manifest_path(ns: str, name: str, tag: str) -> Path:
    return ollama_models_dir() / "manifests" / "registry.ollama.ai" / ns / name / tag


def _layers(manifest: dict, spec: str) -> list[dict]:
    blobs = [manifest.get("config"), *(manifest.get("layers") or [])]
    out = []
    for b in blobs:
        if b is None:
            continue
        if not isinstance(b, dict) or not _DIGEST.fullmatch(str(b.get("digest"))) \
                or not isinstance(b.get("size"), int) or b["size"] < 0:
            raise PullError(f"{spec}: the registry's manifest has a layer without a sha256 digest and a size: {b!r}")
        out.append(b)
    if not any(b.get("mediaType") == OLLAMA_MODEL_LAYER for b in out):
        raise PullError(f"{spec}: the manifest has no {OLLAMA_MODEL_LAYER} layer (not a model?)")
    return out


def pull(spec: str, registry: str | None = None, retries: int = 3) -> Path:
    """Downloads the model and returns its manifest's path (already there: nothing fetched)."""
    ns, name, tag = parse_name(spec)
    base = registry_url(registry)
    url = f"{base}/v2/{ns}/{name}/manifests/{tag}"
    label = f"{ns}/{name}:{tag}" if ns != "library" else f"{name}:{tag}"
    with client({"Accept": MANIFEST_ACCEPT}) as http:
        try:
            r = http.get(url)
        except httpx.TransportError as e:
            raise unreachable(url, e) from None
        if r.status_code == 404:
            raise PullError(f"{label}: no such model in the Ollama library ({url} answered 404)")
        if r.status_code != 200:
            raise http_error(r, label)
        raw = r.content
        try:
            manifest = json.loads(raw)
        except ValueError:
            raise PullError(f"{label}: the registry's manifest is not JSON ({url})") from None
        layers = _layers(manifest, label)
        blobs = ollama_models_dir() / "blobs"
        dest = {b["digest"]: blobs / b["digest"].replace(":", "-") for b in layers}
        sizes = {b["digest"]: b["size"] for b in layers}
        need = sum(missing_bytes(dest[d], sizes[d]) for d in dest)
        check_space(blobs, need, label)
        total = sum(sizes.values())
        with progress(total, f"pull {label}", initial=total - need) as bar:
            for d, path in dest.items():
                fetch(http, f"{base}/v2/{ns}/{name}/blobs/{d}", path, size=sizes[d],
                      digest=Digest("sha256", d.split(":", 1)[1]), name=f"{label} blob {d[7:19]}",
                      bar=bar, retries=retries)
    out = manifest_path(ns, name, tag)
    replace_atomically(out, data=raw)
    return out
