"""Hugging Face repos (`Org/Name`, `Org/Name:Q4_K_M`, `--include PATTERN`) into the standard hub
cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub), laid out as
huggingface_hub lays it out: `models--Org--Name/blobs/<etag>` (the LFS sha256, or git's blob
sha1 for small files), `snapshots/<commit>/<path>` -> ../../blobs/<etag>, `refs/<revision>`.

huggingface_hub does the Hub side: the repo listing with sizes and hashes (`model_info(...,
files_metadata=True)`: GET {HF_ENDPOINT}/api/models/{repo}/revision/{rev}?blobs=true), the
resolve URLs (`hf_hub_url`: {HF_ENDPOINT}/{repo}/resolve/{commit}/{path}), the token
(HF_TOKEN, else the stored login) and its typed errors. The bytes go through
hub/download.py instead of `hf_hub_download`, which in huggingface_hub 2.x deletes a partial
download on failure (no resume) and does not hash what it received; here every file is
resumable and checked against the listing's sha256 / blob id before it enters the cache."""
from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path

from ..errors import PullError
from ..progress import progress
from ..weights.stores import hf_hub_cache, quant_in
from .download import Digest, check_space, client, fetch, missing_bytes, replace_atomically, unreachable

DEFAULT_ENDPOINT = "https://huggingface.co"
# what a repo with safetensors also ships that a server never reads
SKIP_WITH_SAFETENSORS = ("*.bin", "*.pt", "*.pth", "*.h5", "*.msgpack", "*.onnx", "*.ot", "*.gguf",
                         "original/*", "onnx/*")
_QUANT = re.compile(r"(?<![A-Za-z0-9])((?:I?Q[0-9]+(?:_[A-Z0-9]+)*)|BF16|F16|F32|MXFP4(?:_MOE)?)(?=[-.]|$)",
                    re.I)


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def parse_name(spec: str) -> tuple[str, str | None]:
    """(repo id, quantization or None): `hf.co/Org/Name:Q4_K_M` -> (Org/Name, Q4_K_M)."""
    s = re.sub(r"^(https?://)?(hf\.co|huggingface\.co)/", "", spec)
    repo, _, quant = s.partition(":")
    parts = repo.split("/")
    if len(parts) != 2 or not all(re.fullmatch(r"[\w.-]+", p) for p in parts):
        raise PullError(f"{spec!r} is not a Hugging Face repo id (ORG/NAME, optionally :QUANT)")
    return repo, quant or None


def quants(files: list[str]) -> list[str]:
    """The quantization tags of a GGUF repo's files (Q4_K_M, Q8_0, UD-Q4_K_XL's Q4_K_XL ...)."""
    out = []
    for f in files:
        if f.endswith(".gguf"):
            m = _QUANT.search(Path(f).stem.split("-000")[0]) or _QUANT.search(f)
            if m and m.group(1).upper() not in out:
                out.append(m.group(1).upper())
    return out


def select(repo: str, files: list[str], quant: str | None, include: list[str]) -> list[str]:
    if include:
        chosen = [f for f in files if any(fnmatch.fnmatch(f, p) for p in include)]
        if not chosen:
            raise PullError(f"{repo}: no file matches --include {' '.join(include)} "
                            f"({len(files)} files in the repo)")
        return chosen
    ggufs = [f for f in files if f.endswith(".gguf")]
    if quant:
        chosen = [f for f in ggufs if quant_in(f, quant)]
        if not chosen:
            have = quants(files)
            raise PullError(f"{repo}: no GGUF file of quantization {quant}"
                            + (f"; the repo has {', '.join(have)}" if have else " (the repo has no GGUF files)"))
        return chosen
    if "config.json" in files:
        if any(f.endswith(".safetensors") for f in files):
            return [f for f in files if not any(fnmatch.fnmatch(f, p) for p in SKIP_WITH_SAFETENSORS)]
        return files
    firsts = [f for f in ggufs if "-of-" not in f or "-00001-of-" in f]
    if len(firsts) == 1:
        return [f for f in ggufs if f == firsts[0] or f.split("-000")[0] == firsts[0].split("-000")[0]]
    if firsts:
        have = quants(files)
        raise PullError(f"{repo}: holds {len(firsts)} GGUF models; pick one quantization, e.g. "
                        f"freetoken pull {repo}:{have[0] if have else 'Q4_K_M'}"
                        + (f" (the repo has {', '.join(have)})" if have else ""))
    raise PullError(f"{repo}: neither a config.json nor a .gguf file in the repo; nothing to serve")


def _hub_errors():
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled,
                                        RepositoryNotFoundError, RevisionNotFoundError)
    transport: tuple = ()
    for mod in ("httpx", "httpx2", "requests"):
        try:
            m = __import__(mod)
            transport += (getattr(m, "TransportError", None) or getattr(m, "ConnectionError"),)
        except ImportError:
            pass
    return OfflineModeIsEnabled, GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError, HfHubHTTPError, transport


def repo_listing(repo: str, revision: str, token: str | None):
    from huggingface_hub import HfApi
    offline, gated, missing, no_rev, http_err, transport = _hub_errors()
    url = f"{endpoint()}/api/models/{repo}"
    try:
        return HfApi(endpoint=endpoint()).model_info(repo, revision=revision, files_metadata=True, token=token)
    except offline:
        raise PullError(f"{repo}: HF_HUB_OFFLINE is set; unset it to download") from None
    except gated:
        raise PullError(f"{repo}: a gated repo; accept its terms on the Hub and set HF_TOKEN "
                        "to a token of that account") from None
    except missing:
        raise PullError(f"{repo}: no such model on {endpoint()} (or it is private: set HF_TOKEN)") from None
    except no_rev:
        raise PullError(f"{repo}: no revision {revision!r}") from None
    except http_err as e:
        status = getattr(getattr(e, "response", None), "status_code", "?")
        raise PullError(f"{repo}: {url} answered {status}") from None
    except transport as e:
        raise unreachable(url, e) from None


def pull(spec: str, include: list[str] | None = None, revision: str = "main", retries: int = 3) -> Path:
    """Downloads the chosen files and returns the snapshot directory."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers
    repo, quant = parse_name(spec)
    token = os.environ.get("HF_TOKEN") or None
    info = repo_listing(repo, revision, token)
    siblings = {s.rfilename: s for s in info.siblings or []}
    chosen = select(repo, sorted(siblings), quant, list(include or []))
    commit = info.sha
    if not commit or not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise PullError(f"{repo}: the Hub's listing has no commit sha for {revision!r}")
    root = hf_hub_cache() / f"models--{repo.replace('/', '--')}"
    plan = []
    for name in chosen:
        s = siblings[name]
        if s.lfs is not None:
            etag, digest, size = s.lfs.sha256, Digest("sha256", s.lfs.sha256), s.lfs.size
        elif s.blob_id and s.size is not None:
            etag, digest, size = s.blob_id, Digest("git-sha1", s.blob_id), s.size
        else:
            raise PullError(f"{repo}: the listing gives no hash and size for {name}")
        plan.append((name, root / "blobs" / etag, digest, size))
    need = sum(missing_bytes(blob, size) for _, blob, _, size in plan)
    check_space(root, need, repo)
    total = sum(size for *_, size in plan)
    headers = build_hf_headers(token=token)
    with client(headers) as http, progress(total, f"pull {repo}" + (f":{quant}" if quant else ""),
                                           initial=total - need) as bar:
        for name, blob, digest, size in plan:
            fetch(http, hf_hub_url(repo, name, revision=commit, endpoint=endpoint()), blob, size=size,
                  digest=digest, name=f"{repo}/{name}", bar=bar, retries=retries)
            link = root / "snapshots" / commit / name
            if not link.exists():
                replace_atomically(link, link_to=os.path.relpath(blob, link.parent))
    if revision != commit:
        replace_atomically(root / "refs" / revision, data=commit.encode())
    return root / "snapshots" / commit
