"""Trust what the disk tier reads: a checksum per expert, and the model file's identity watched.

Checksums: one xxh3-64 per expert over its file bytes (every piece of every disk bank, in the
order `ExpertReader` reads them), taken once per file version at load (a full pass over the
experts at disk speed) and kept in ~/.cache/freetoken/expert-sums/ keyed by the file's path and
layout, valid while the file's identity is the one they were taken from. Every read of an
expert from the file is hashed as it lands and compared (host_cache.py): a mismatch is an
`ExpertReadError` for the requests that need that expert, never wrong bytes served. Once an
expert's read has matched, a later read of it is not hashed again while the file is the
verified version (`ExpertFileWatch.known`: its open fd's fstat identity, one syscall, is the
verified one, the state is "ok"; `REHASH` hashes every read as before): the hash is a pass over
the expert in RAM after the disk wrote it (0.37 ms of the 1.33 ms of CPU an I/O thread spends on
a 2.9 MB Q4_K_M expert, Zen 1), and at twice the allowed memory most reads are re-reads of
experts evicted earlier. A write to the file moves its mtime, so a re-read after a change is
hashed again; what a re-read does not catch is bytes that change under an unchanged identity
(storage that returns other bytes than it was given, or an mtime set back on purpose). A short
read is an error whether or not the read is hashed.

Identity: (device, inode, size, mtime) of each file, looked at between engine steps
(`ExpertFileWatch.poll`, one stat per file). When it differs from the verified one, or a read
did not match its checksum, the watch says "changed": the caller drops every cached expert
of the file (bytes read before the change were verified, but the issue's rule is that nothing
of a changed file is kept), health reads degraded, and a background pass re-verifies the file
as it now is against the checksums. Meanwhile every read is still verified one by one, so an
expert serves only with its original bytes; once the whole file matches again (a restored
copy) its identity becomes the verified one and the state is "ok".
"""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import numpy as np
import xxhash

from .hash_nogil import xxh3_64
from .pieces import DiskLayout

log = logging.getLogger("freetoken.experts")

SUMS_DIR = Path.home() / ".cache" / "freetoken" / "expert-sums"
REHASH = False          # True: hash every read, also of experts already matched in this file version
Identity = tuple[tuple[int, int, int, int], ...]


def identity(paths: list[Path]) -> Identity:
    """(st_dev, st_ino, st_size, st_mtime_ns) of each file; a missing file is all -1."""
    out = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append((-1, -1, -1, -1))
    return tuple(out)


def layout_key(layout: DiskLayout) -> str:
    """What the checksums depend on besides the bytes: the files and where each piece lies."""
    h = xxhash.xxh3_128()
    for p in layout.paths:
        h.update(str(Path(p).resolve()).encode() + b"\0")
    for name, bank in layout.banks.items():
        h.update(name.encode() + b"\0")
        for pc in bank.pieces:
            h.update(np.ascontiguousarray(pc.files, np.int32).tobytes())
            h.update(np.ascontiguousarray(pc.offsets, np.int64).tobytes())
            h.update(np.int64(pc.nbytes).tobytes())
    return h.hexdigest()


def expert_pieces(layout: DiskLayout, flat: int):
    """(file index, offset, nbytes) of each piece of expert `flat`, in the reader's order."""
    for bank in layout.banks.values():
        for pc in bank.pieces:
            if pc.files[flat] >= 0:
                yield int(pc.files[flat]), int(pc.offsets[flat]), pc.nbytes


class ChecksumMismatch(Exception):
    def __init__(self, flat: int, msg: str):
        super().__init__(msg)
        self.flat = flat


def hash_file_experts(layout: DiskLayout, expect: np.ndarray | None = None,
                      stop: threading.Event | None = None) -> np.ndarray:
    """xxh3-64 of every expert's file bytes, read with pread (its pages dropped behind). With
    `expect`, raises ChecksumMismatch at the first expert that differs (or cannot be read)."""
    n = layout.num_layers * layout.num_experts
    out = np.zeros(n, np.uint64)
    fds = [os.open(p, os.O_RDONLY) for p in layout.paths]
    buf = bytearray(max((pc.nbytes for b in layout.banks.values() for pc in b.pieces), default=0))
    view = memoryview(buf)
    try:
        for flat in range(n):
            if stop is not None and stop.is_set():
                raise ChecksumMismatch(flat, "re-verification stopped")
            h = xxh3_64()             # without the GIL: a background re-verification must not stall decode
            for fi, off, nb in expert_pieces(layout, flat):
                got = os.preadv(fds[fi], [view[:nb]], off)
                if got < nb:
                    L, E = divmod(flat, layout.num_experts)
                    raise ChecksumMismatch(flat, f"{layout.paths[fi]}: expert {E} of MoE layer {L} needs bytes "
                                                 f"{off}..{off + nb} but the file is shorter")
                h.update(view[:nb])
                os.posix_fadvise(fds[fi], off, nb, os.POSIX_FADV_DONTNEED)
            out[flat] = h.intdigest()
            if expect is not None and out[flat] != expect[flat]:
                L, E = divmod(flat, layout.num_experts)
                raise ChecksumMismatch(flat, f"{layout.paths[0]}: expert {E} of MoE layer {L} does not match its "
                                             "checksum")
    finally:
        for fd in fds:
            os.close(fd)
    return out


def _sums_path(layout: DiskLayout, key: str) -> Path:
    return SUMS_DIR / f"{Path(layout.paths[0]).name}-{key[:24]}.npz"


def load_or_take(layout: DiskLayout) -> tuple[np.ndarray, Identity]:
    """The checksums of the file as it is now: from the kept copy when it was taken from this
    very version of the file (same identity and layout), else taken now (a pass over every
    expert) and kept for the next start."""
    key = layout_key(layout)
    path = _sums_path(layout, key)
    ident = identity(layout.paths)
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["key"]) == key and tuple(map(tuple, z["identity"].tolist())) == ident:
                return z["digests"].astype(np.uint64), ident
    except (OSError, KeyError, ValueError):
        pass
    digests = hash_file_experts(layout)
    if identity(layout.paths) != ident:          # changed while hashing: not a version to trust
        return load_or_take(layout)
    try:
        SUMS_DIR.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}.npz")
        np.savez(tmp, key=np.array(key), identity=np.array(ident, np.int64), digests=digests)
        os.replace(tmp, path)
    except OSError as e:                         # read-only home: checksums for this run only
        log.warning("disk tier: cannot keep expert checksums in %s (%s); they are taken again next start",
                    SUMS_DIR, e)
    return digests, ident


class ExpertFileWatch:
    """The checksums and the identity of the files they were taken from (see the module doc)."""

    def __init__(self, layout: DiskLayout, digests: np.ndarray, verified: Identity):
        self.layout, self.digests, self.verified = layout, digests, verified
        self.state, self.detail = "ok", ""
        self.changes = 0                  # times the file was seen changed (a change or a mismatch)
        self.mismatches = 0               # reads that did not match their checksum
        self._lock = threading.Lock()
        self._flagged = False             # a read mismatched since the last poll
        self._seen = verified             # the identity the last re-verification was started for
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._matched = np.zeros(len(digests), bool)    # experts a read has matched since the last change

    @classmethod
    def open(cls, layout: DiskLayout) -> "ExpertFileWatch":
        digests, ident = load_or_take(layout)
        return cls(layout, digests, ident)

    def known(self, flat: int, fds: list[int]) -> bool:
        """Whether a read of expert `flat` through `fds` (the reader's open files) needs no hash:
        a read of it has matched, nothing was seen changed since, and the files are the verified
        version now (fstat: an in-place write moves the mtime at once)."""
        if REHASH or not self._matched[flat] or self.state != "ok":
            return False
        try:
            now = tuple((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) for st in map(os.fstat, fds))
        except OSError:
            return False
        return now == self.verified

    def check(self, flat: int, digest: int) -> str | None:
        """None when `digest` (of bytes just read) is expert `flat`'s; else the error line."""
        if digest == int(self.digests[flat]):
            self._matched[flat] = True
            return None
        L, E = divmod(flat, self.layout.num_experts)
        with self._lock:
            self.mismatches += 1
            self._flagged = True
            self._matched[:] = False
            if self.state == "ok":
                self.state, self.detail = "changed", f"expert {E} of MoE layer {L} does not match its checksum"
        return (f"{self.layout.paths[0]}: expert {E} of MoE layer {L} does not match its checksum: the file "
                "changed after it was verified (it serves again once the original bytes are back)")

    def poll(self) -> bool:
        """Between steps: True when the caller must drop every cached expert of the file (its
        identity moved away from the verified one, or a read mismatched); a re-verification of
        the file as it is now starts in the background."""
        cur = identity(self.layout.paths)
        with self._lock:
            flagged, self._flagged = self._flagged, False
            if cur == self.verified and not flagged:
                if self.state != "ok" and self._thread is None:
                    self.state, self.detail = "ok", ""
                return False
            if cur == self._seen and not flagged:
                return False
            self._seen = cur
            self._matched[:] = False            # every expert is hashed again until it matches
            self.changes += 1
            if self.state == "ok":
                self.state, self.detail = "changed", "the file's identity (device, inode, size, mtime) changed"
            log.warning("disk tier: %s changed while serving (%s); cached experts dropped, re-verifying",
                        self.layout.paths[0], self.detail)
        self._reverify(cur)
        return True

    def _reverify(self, cur: Identity) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._stop = stop = threading.Event()

        def run():
            try:
                hash_file_experts(self.layout, self.digests, stop)
                ok, why = identity(self.layout.paths) == cur, "changed again while re-verifying"
            except (ChecksumMismatch, OSError) as e:
                ok, why = False, str(e)
            with self._lock:
                if stop.is_set():
                    return
                self._thread = None
                if ok:
                    self.verified, self.state, self.detail = cur, "ok", ""
                    log.warning("disk tier: %s matches its expert checksums again; serving from it", self.layout.paths[0])
                else:
                    self.state, self.detail = "changed", why

        with self._lock:
            self.state = "verifying" if self.state != "ok" else self.state
            self._thread = threading.Thread(target=run, name="freetoken-disk-verify", daemon=True)
            self._thread.start()

    def wait(self, timeout: float | None = None) -> None:
        """Tests: until the re-verification in the background (if any) is over."""
        t = self._thread
        if t is not None:
            t.join(timeout)

    def stats(self) -> dict:
        with self._lock:
            return {"integrity": self.state, "integrity_detail": self.detail, "file_changes": self.changes,
                    "checksum_mismatches": self.mismatches}

    def close(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None:
            t.join()
