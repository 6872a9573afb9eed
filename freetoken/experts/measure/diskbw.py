"""B_D: the bytes/s the disk delivers to the disk tier's reads (`freetoken profile`).

Measured the way the host expert cache reads (host_cache.py): whole experts (`piece` bytes)
at random offsets of a file whose pages were dropped from the page cache first, `threads`
reads in flight (`os.preadv` releases the GIL), each read's pages dropped behind it. Without
a file to read (no --disk-file), a scratch file of `scratch_mib` is written beside the
profile, flushed, measured and deleted."""
from __future__ import annotations

import mmap
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..disk.direct import ALIGN, open_direct

THREADS = 4          # HostExpertCache's io_threads default


def _drop(fd: int) -> None:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def read_bandwidth(path: str | os.PathLike, piece: int, seconds: float = 1.0, threads: int = THREADS,
                   seed: int = 0, direct: str = "off") -> float:
    """Bytes/s of `piece`-byte reads at random 4 KiB-aligned offsets of `path` (uncached),
    `threads` in flight; `direct` "auto"/"on": O_DIRECT where the filesystem allows, as the
    disk tier reads (experts/disk/direct.py)."""
    path = Path(path)
    size = path.stat().st_size
    if size < 2 * piece:
        raise ValueError(f"{path}: {size} bytes, too small to measure reads of {piece} bytes")
    dfd = open_direct(path, direct)
    fd = os.open(path, os.O_RDONLY) if dfd is None else dfd
    try:
        _drop(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        rng = np.random.default_rng(seed)
        slots = (size - piece) // ALIGN
        span = -(-piece // ALIGN) * ALIGN
        bufs = [mmap.mmap(-1, span) for _ in range(threads)]     # page-aligned (O_DIRECT needs it)

        def one(i: int, off: int) -> int:
            n = os.preadv(fd, [bufs[i]], off)
            if dfd is None:
                os.posix_fadvise(fd, off, n, os.POSIX_FADV_DONTNEED)
            return n

        done, t0 = 0, time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            while time.perf_counter() - t0 < seconds:
                offs = (rng.integers(0, slots + 1, threads) * ALIGN).tolist()
                done += sum(pool.map(one, range(threads), offs))
        for b in bufs:
            b.close()
        return done / (time.perf_counter() - t0)
    finally:
        os.close(fd)


DEPTHS = (1, 2, 4, 8, 16, 32)


def best_queue_depth(path: str | os.PathLike, piece: int, seconds: float = 0.5, depths=DEPTHS,
                     direct: str = "auto") -> tuple[int, float, dict[int, float]]:
    """The reads in flight at which `read_bandwidth` is highest: (depth, bytes/s, {depth:
    bytes/s}). A deeper queue must beat the best shallower one by 5% to be chosen (each
    thread holds a bounce buffer and a core's share of the GIL for nothing otherwise)."""
    table = {d: read_bandwidth(path, piece, seconds, d, direct=direct) for d in depths}
    best = depths[0]
    for d in depths[1:]:
        if table[d] > 1.05 * table[best]:
            best = d
    return best, table[best], table


def scratch_bandwidth(directory: str | os.PathLike, piece: int, seconds: float = 1.0, scratch_mib: int = 512,
                      threads: int = THREADS, measure=None):
    """`read_bandwidth` (or `measure(path, piece, seconds)`) over a scratch file of
    `scratch_mib` MiB written in `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=directory, prefix=".freetoken-diskbw-")
    try:
        block = np.random.default_rng(1).integers(0, 256, 8 << 20, dtype=np.uint8).tobytes()
        with os.fdopen(fd, "wb") as f:
            for _ in range(max(1, scratch_mib // 8)):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        return measure(name, piece, seconds) if measure else read_bandwidth(name, piece, seconds, threads)
    finally:
        os.unlink(name)


def prefetch_budget(b_d: float | None, gap_s: float | None, expert_nbytes: int) -> int | None:
    """How many experts the disk can bring in the time between two layer calls (attention and
    the dense layers run meanwhile): more predicted experts than that would queue behind each
    other and delay the next layer's own misses. None: no bound (B_D or the gap unknown)."""
    if not b_d or not gap_s or expert_nbytes <= 0:
        return None
    return max(1, int(b_d * gap_s // expert_nbytes))
