"""One file over HTTP into a content-addressed store: resumable, verified, never half-written.

Bytes go to `<dest>.partial`; a cut connection leaves it and the next try (an automatic retry,
or the same command again) asks for the rest with `Range: bytes=N-` after re-hashing what is
there. The digest (sha256, or git's blob sha1 for small Hugging Face files) is checked before
the rename to `dest`; a mismatch deletes the partial. Redirects are followed (both registries
send blobs to a CDN); httpx drops Authorization when a redirect leaves the origin."""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from ..errors import PullError
from ..progress import Progress, progress

CHUNK = 1 << 20
TIMEOUT = httpx.Timeout(30.0, read=60.0)
SPACE_MARGIN = 64 << 20          # left free beyond the download itself


@dataclass(frozen=True)
class Digest:
    kind: str                    # "sha256" | "git-sha1" (sha1 of b"blob <size>\0" + content)
    hex: str

    def hasher(self, size: int | None):
        if self.kind == "sha256":
            return hashlib.sha256()
        if self.kind == "git-sha1":
            if size is None:
                raise ValueError("a git blob digest needs the size")
            h = hashlib.sha1()
            h.update(f"blob {size}\0".encode())
            return h
        raise ValueError(f"unknown digest kind {self.kind!r}")


def client(headers: dict | None = None) -> httpx.Client:
    return httpx.Client(follow_redirects=True, timeout=TIMEOUT, headers=headers or {})


def partial_of(dest: Path) -> Path:
    return dest.with_name(dest.name + ".partial")


def replace_atomically(dest: Path, *, data: bytes | None = None, link_to: str | None = None) -> None:
    """Writes `data` (or a symlink to `link_to`) under a name unique to this call, then renames it
    onto `dest`: a reader sees the old file or the new one, and two pulls at once (two processes
    or two threads of one) never rename each other's temporary file away."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{threading.get_ident()}.{time.monotonic_ns()}.tmp")
    try:
        if link_to is not None:
            tmp.symlink_to(link_to)
        else:
            tmp.write_bytes(data or b"")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def free_bytes(directory: Path) -> int:
    d = directory
    while not d.exists():
        d = d.parent
    return shutil.disk_usage(d).free


def check_space(directory: Path, needed: int, what: str) -> None:
    """One line before anything is written when `needed` bytes do not fit `directory`."""
    free = free_bytes(directory)
    if needed + SPACE_MARGIN > free:
        raise PullError(f"{what}: needs {needed / 2**30:.2f} GiB more in {directory}, only "
                        f"{free / 2**30:.2f} GiB free (free some space or point the store elsewhere)")


def missing_bytes(dest: Path, size: int) -> int:
    """What `fetch` still has to download for `dest` (0 when it is complete)."""
    if dest.is_file():
        return 0
    p = partial_of(dest)
    have = p.stat().st_size if p.is_file() else 0
    return max(0, size - have) if have <= size else size


def unreachable(url: str, e: Exception) -> PullError:
    host = httpx.URL(url).host or url
    return PullError(f"cannot reach {host}: {type(e).__name__}: {e or 'no answer'} (no network? a proxy?)")


def _rehash(partial: Path, h, bar_desc: str) -> int:
    n = partial.stat().st_size
    with open(partial, "rb") as f, progress(n, bar_desc) as bar:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            bar.update(len(chunk))
    return n


class _State:
    """Bytes in the .partial and the running hash of exactly those bytes."""

    def __init__(self, digest: Digest, size: int | None):
        self.digest, self.size, self.have, self.h = digest, size, 0, digest.hasher(size)

    def restart(self) -> None:          # the caller rewrites the .partial from byte 0 ("wb")
        self.have, self.h = 0, self.digest.hasher(self.size)


def fetch(http: httpx.Client, url: str, dest: Path, *, size: int | None, digest: Digest, name: str,
          bar: Progress | None = None, retries: int = 3) -> None:
    """`dest` complete and verified, or a PullError (a cut connection keeps the .partial to resume).
    A second pull of the same blob (another process) waits for the first on the partial's lock."""
    if dest.is_file():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = partial_of(dest)
    with open(part, "ab") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not dest.is_file():
                _fetch_locked(http, url, dest, part, size, digest, name, bar, retries)
        finally:
            if part.is_file() and part.stat().st_size == 0:
                part.unlink(missing_ok=True)     # nothing received: no empty partial left behind


def _fetch_locked(http, url, dest: Path, part: Path, size, digest: Digest, name: str, bar, retries: int) -> None:
    st = _State(digest, size)
    if size is not None and part.stat().st_size > size:
        os.truncate(part, 0)                     # the same inode: the lock stays on it
    elif part.stat().st_size:
        st.have = _rehash(part, st.h, f"checksum {name} (resume)")
    attempt = 0
    while True:
        try:
            _get(http, url, part, st, name, bar)
            break
        except (httpx.TransportError, _Cut) as e:
            if attempt >= retries:
                raise PullError(f"{name}: connection lost after {st.have / 2**20:.1f} of "
                                f"{(size or 0) / 2**20:.1f} MiB ({type(e).__name__}: {e}); run the same "
                                "command again to resume") from None
            attempt += 1
            time.sleep(min(4.0, 0.25 * 2 ** attempt))
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise PullError(f"{name}: the disk holding {part.parent} is full after "
                                f"{st.have / 2**20:.1f} MiB; free space and run again to resume") from None
            raise PullError(f"{name}: cannot write {part}: {e.strerror or e}") from None
    if size is not None and st.have != size:
        part.unlink(missing_ok=True)
        raise PullError(f"{name}: the server sent {st.have} bytes, the listing says {size} (nothing kept)")
    if st.h.hexdigest() != digest.hex.lower():
        part.unlink(missing_ok=True)
        raise PullError(f"{name}: {digest.kind} mismatch: expected {digest.hex}, got {st.h.hexdigest()} "
                        "(the download is corrupt; nothing kept, run again to retry)")
    os.replace(part, dest)


class _Cut(Exception):
    """The body ended before Content-Length said (some servers close without an error)."""


def _get(http: httpx.Client, url: str, part: Path, st: _State, name: str, bar: Progress | None) -> None:
    if st.size is not None and st.have == st.size:
        return
    headers = {"Accept-Encoding": "identity", **({"Range": f"bytes={st.have}-"} if st.have else {})}
    with http.stream("GET", url, headers=headers) as r:
        if r.status_code == 416 and st.size is not None and st.have == st.size:
            return
        if r.status_code == 200 and st.have:               # Range ignored: start over
            st.restart()
        elif r.status_code == 206:
            start = r.headers.get("Content-Range", "").removeprefix("bytes ").split("-")[0]
            if start != str(st.have):
                raise PullError(f"{name}: asked for bytes {st.have}-, the server sent "
                                f"{r.headers.get('Content-Range')}")
        elif r.status_code != 200:
            raise http_error(r, name)
        length = r.headers.get("Content-Length")
        expect = int(length) + st.have if length and length.isdigit() else None
        with open(part, "ab" if st.have else "wb") as f:
            try:
                for chunk in r.iter_raw():      # as received: a cut keeps every byte that came
                    f.write(chunk)
                    st.h.update(chunk)
                    st.have += len(chunk)
                    if bar is not None:
                        bar.update(len(chunk))
            finally:
                f.flush()
                os.fsync(f.fileno())
        if expect is not None and st.have < expect:
            raise _Cut(f"body ended at {st.have} of {expect} bytes")


def http_error(r: httpx.Response, name: str) -> PullError:
    if r.status_code == 404:
        return PullError(f"{name}: not found ({r.request.url} answered 404)")
    if r.status_code in (401, 403):
        return PullError(f"{name}: access refused ({r.status_code}); a gated or private repo needs "
                         "HF_TOKEN set to a token that has accepted its terms")
    return PullError(f"{name}: {r.request.url} answered {r.status_code} {r.reason_phrase}")
