"""O_DIRECT reads for the disk tier: the disk writes straight into our memory, no page cache.

A buffered `pread` copies every byte twice through RAM (disk -> page cache -> slot) and then
has to drop the page-cache copy again (fadvise DONTNEED); on a 2-core box that copy is CPU
time the kernels do not get. With O_DIRECT the device DMAs into an aligned user buffer:
offset, length and buffer address must be multiples of the disk's direct-I/O alignment (its
logical block size, 512 on most disks; `dio_align` finds it with one probe read, 4096 covers
every common disk). An expert piece of a GGUF sits at an arbitrary offset (32 bytes past a
sector boundary in llama.cpp's files), so it is read as the aligned span around it: straight
into the host cache's slot where the slot's frame is laid out for it (host_rows.py: the row
starts at the piece's offset modulo the alignment, the span's extra head and tail bytes land
in the frame's own padding, `read_span`), else into a per-thread aligned bounce buffer and the
piece copied out of it (one copy, where buffered reads make two).

Where the filesystem refuses O_DIRECT (tmpfs, some FUSE/overlay mounts: open or the first
read fails with EINVAL), "auto" falls back to buffered reads; "on" is an error there.
"""
from __future__ import annotations

import errno
import mmap
import os
import threading

ALIGN = 4096
DIRECT_CHOICES = ("auto", "on", "off")


def open_direct(path, mode: str) -> int | None:
    """An O_DIRECT fd on `path` when `mode` allows and the filesystem supports it (probed with
    one aligned read), else None ("off", or "auto" where it is refused)."""
    if mode not in DIRECT_CHOICES:
        raise ValueError(f"direct I/O must be one of {', '.join(DIRECT_CHOICES)}, got {mode!r}")
    flag = getattr(os, "O_DIRECT", 0)
    if mode == "off" or (not flag and mode == "auto"):
        return None
    try:
        if not flag:
            raise OSError(errno.EINVAL, "O_DIRECT is not available on this platform")
        fd = os.open(path, os.O_RDONLY | flag)
    except OSError as e:
        if mode == "on":
            raise OSError(e.errno, f"{path}: O_DIRECT refused ({e.strerror}); use direct I/O auto or off") from e
        return None
    try:
        if os.fstat(fd).st_size >= ALIGN:
            buf = mmap.mmap(-1, ALIGN)
            try:
                os.preadv(fd, [buf], 0)
            finally:
                buf.close()
    except OSError as e:
        os.close(fd)
        if mode == "on":
            raise OSError(e.errno, f"{path}: O_DIRECT reads refused ({e.strerror}); use direct I/O auto or off") from e
        return None
    return fd


def dio_align(fd: int) -> int:
    """The smallest alignment (512, 1024, 2048 or 4096) this O_DIRECT fd reads at: offset,
    length and memory all at that multiple (one probe read each); ALIGN where the file is too
    small to tell."""
    if os.fstat(fd).st_size < 2 * ALIGN:
        return ALIGN
    view = memoryview(mmap.mmap(-1, 2 * ALIGN))      # page-aligned; freed with its last view
    for a in (512, 1024, 2048):
        try:
            if os.preadv(fd, [view[a:2 * a]], a) == a:
                return a
        except OSError:
            pass
    return ALIGN


def read_span(fd: int, buf: memoryview, start: int) -> int:
    """Whole aligned blocks from `start` into `buf` (aligned, its length a multiple of the
    alignment) until full or the file ends; returns the bytes read (O_DIRECT continuations stay
    aligned: a count short of a whole block is the end)."""
    got, span = 0, len(buf)
    while got < span:
        k = os.preadv(fd, [buf[got:]], start + got)
        got += k
        if k == 0 or k % 512:
            break
    return got


class Bounce(threading.local):
    """One page-aligned buffer per I/O thread (anonymous mmap: page-aligned), grown on demand."""

    def get(self, nbytes: int) -> memoryview:
        buf = getattr(self, "buf", None)
        if buf is None or len(buf) < nbytes:       # the old one is freed with its last view
            buf = self.buf = mmap.mmap(-1, -(-nbytes // ALIGN) * ALIGN)
        return memoryview(buf)


def address(view: memoryview) -> int:
    import ctypes
    return ctypes.addressof(ctypes.c_char.from_buffer(view)) if not view.readonly else 0


def read_exact(fd: int, view: memoryview, off: int) -> int:
    """preadv until `view` is full or the file ends; returns the bytes read."""
    got, n = 0, len(view)
    while got < n:
        k = os.preadv(fd, [view[got:]], off + got)
        if k == 0:
            break
        got += k
    return got


def read_direct(fd: int, bounce: Bounce, off: int, nbytes: int, dst: memoryview | None) -> tuple[memoryview, int]:
    """The piece [off, off+nbytes) through an O_DIRECT fd: (a view of its bytes, bytes of it
    read). Straight into `dst` when everything is aligned, else via the thread's bounce buffer
    (the caller copies out). A short count means the file ended."""
    if dst is not None and off % ALIGN == 0 and nbytes % ALIGN == 0 and address(dst) % ALIGN == 0:
        return dst, read_exact(fd, dst, off)
    start = off - off % ALIGN
    span = -(-(off + nbytes - start) // ALIGN) * ALIGN
    buf = bounce.get(span)[:span]
    got = read_span(fd, buf, start)
    head = off - start
    return buf[head:head + nbytes], max(0, min(nbytes, got - head))
