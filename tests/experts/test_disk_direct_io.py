"""O_DIRECT reads (experts/disk/direct.py) put exactly the file's bytes in the slots, for pieces
at unaligned offsets and lengths (through the bounce buffer) and at aligned ones (straight into
the slot), with any number of reads in flight; where the filesystem refuses O_DIRECT, "auto"
reads buffered and "on" says so in one line; a short read, an EIO and a file truncated under
the reader are clear errors for the experts that need them, and the cache keeps serving."""
from __future__ import annotations

import errno
import os

import numpy as np
import pytest
import torch

from freetoken.experts.disk import c_reads, direct
from freetoken.experts.disk.host_cache import ExpertReadError, HostExpertCache
from freetoken.experts.disk.pieces import BankLayout, DiskLayout, Piece
from freetoken.experts.memory.pool import ExpertSpec

L, E = 2, 4


def _layout(path, row: int, stride: int, skew: int):
    """Two banks per expert (pieces `row` bytes, `stride` apart, first at `skew`), the file
    random bytes; returns (layout, {flat: {bank: bytes}})."""
    n = L * E
    rng = np.random.default_rng(row + skew)
    data = rng.integers(0, 256, skew + 2 * n * stride + 100, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    order = rng.permutation(2 * n).reshape(2, n)
    off = skew + order.astype(np.int64) * stride
    z = np.zeros(n, np.int32)
    banks = {"a": BankLayout(torch.uint8, (row,), [Piece(z, off[0], row, 0)]),
             "b": BankLayout(torch.uint8, (row,), [Piece(z, off[1], row, 0)])}
    want = {f: {"a": data[off[0, f]:off[0, f] + row], "b": data[off[1, f]:off[1, f] + row]} for f in range(n)}
    return DiskLayout([path], banks, L, E, ExpertSpec(8, 8)), want


def _check_all(cache, want):
    for f in range(L * E):
        n, slots = cache.acquire(np.array([f]))
        for k in ("a", "b"):
            assert np.array_equal(cache.banks[k][slots[0]].numpy(), want[f][k]), (f, k)
        cache.release(slots)


SHAPES = [(100, 333, 7), (4096, 8192, 0), (8192, 12288, 4096), (5000, 5000, 123)]


@pytest.mark.parametrize("row,stride,skew", SHAPES, ids=[f"row{r}-stride{s}-skew{k}" for r, s, k in SHAPES])
@pytest.mark.parametrize("mode,threads", [("on", 1), ("on", 8), ("off", 3), ("auto", 2)])
def test_bytes_exact_direct_or_buffered(tmp_path, row, stride, skew, mode, threads):
    lay, want = _layout(tmp_path / "f.bin", row, stride, skew)
    cache = HostExpertCache(lay, 3, "lru", threads=threads, direct_io=mode)
    try:
        assert cache.reader.describe()["mode"] == ("buffered" if mode == "off" else "direct")
        _check_all(cache, want)
        cache.prefetch(np.arange(L * E))
        cache.drain()
        cache.check()
        _check_all(cache, want)
    finally:
        cache.close()


def test_aligned_piece_lands_in_place(tmp_path):
    """An aligned piece into an aligned slot row is read with no bounce copy."""
    lay, want = _layout(tmp_path / "f.bin", 8192, 8192, 0)
    cache = HostExpertCache(lay, 2, "lru", threads=1, direct_io="on")
    bounced = []
    real = direct.Bounce.get
    direct.Bounce.get = lambda self, n: (bounced.append(n), real(self, n))[1]
    try:
        dst = cache.banks["a"][0]
        if dst.data_ptr() % direct.ALIGN:
            pytest.skip("slot rows not page-aligned here")
        _check_all(cache, want)
        assert not bounced
    finally:
        direct.Bounce.get = real
        cache.close()


def test_filesystem_refusing_o_direct(tmp_path, monkeypatch):
    lay, want = _layout(tmp_path / "f.bin", 100, 333, 7)
    real_open = os.open

    def refuse(path, flags, *a):
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *a)

    monkeypatch.setattr(os, "open", refuse)
    cache = HostExpertCache(lay, 3, "lru", threads=2, direct_io="auto")
    try:
        assert cache.reader.describe()["mode"] == "buffered"
        _check_all(cache, want)
    finally:
        cache.close()
    with pytest.raises(OSError, match="O_DIRECT refused.*direct I/O auto or off"):
        HostExpertCache(lay, 3, "lru", threads=2, direct_io="on")
    with pytest.raises(ValueError, match="direct I/O must be one of"):
        HostExpertCache(lay, 3, "lru", direct_io="maybe")


@pytest.mark.parametrize("mode", ["on", "off"])
def test_truncated_file_fails_only_the_lost_experts(tmp_path, mode):
    lay, want = _layout(tmp_path / "f.bin", 5000, 5000, 123)
    cache = HostExpertCache(lay, 3, "lru", threads=2, direct_io=mode)
    try:
        ends = {f: max(int(pc.offsets[f]) + pc.nbytes for b in lay.banks.values() for pc in b.pieces)
                for f in range(L * E)}
        lost = max(ends, key=ends.get)
        os.truncate(lay.paths[0], ends[lost] - 1)            # one byte short
        with pytest.raises(ExpertReadError, match=f"truncated: expert {lost % E} of MoE layer {lost // E}"):
            cache.acquire(np.array([lost]))
        cache.check()
        ok = [f for f in range(L * E) if ends[f] < ends[lost] - 5000]
        for f in ok:
            n, slots = cache.acquire(np.array([f]))
            assert np.array_equal(cache.banks["a"][slots[0]].numpy(), want[f]["a"])
            cache.release(slots)
        assert cache.stats()["read_errors"] == 1 and (cache.table.locks == 0).all()
    finally:
        cache.close()


@pytest.mark.parametrize("mode", ["on", "off"])
@pytest.mark.parametrize("fault", ["eio", "short"])
def test_eio_or_short_read_is_a_clear_error_for_that_expert(tmp_path, monkeypatch, mode, fault):
    """The disk answers EIO (or fewer bytes than the file has) for one expert's piece: that
    expert's callers get ExpertReadError naming it; the others are read; a retry reads it."""
    lay, want = _layout(tmp_path / "f.bin", 5000, 5000, 123)
    bad_off = int(lay.banks["b"].pieces[0].offsets[5])
    real = os.preadv
    armed = [True]

    def faulty(fd, bufs, off):
        span = sum(len(b) for b in bufs)
        if armed[0] and off <= bad_off < off + span:
            if fault == "eio":
                raise OSError(errno.EIO, "Input/output error")
            return 0
        return real(fd, bufs, off)

    monkeypatch.setattr(os, "preadv", faulty)
    monkeypatch.setattr(c_reads, "ENABLED", False)      # (the C read's pread is not `os.preadv`)
    cache = HostExpertCache(lay, 3, "lru", threads=2, direct_io=mode)
    try:
        msg = "Input/output error" if fault == "eio" else "truncated"
        with pytest.raises(ExpertReadError, match=f"expert 1 of MoE layer 1.*{msg}|{msg}.*expert 1 of MoE layer 1"):
            cache.acquire(np.array([5]))
        cache.check()
        for f in (0, 1, 6):
            n, slots = cache.acquire(np.array([f]))
            assert np.array_equal(cache.banks["b"][slots[0]].numpy(), want[f]["b"])
            cache.release(slots)
        armed[0] = False                                     # the disk recovered: read again
        n, slots = cache.acquire(np.array([5]))
        assert np.array_equal(cache.banks["b"][slots[0]].numpy(), want[5]["b"])
        cache.release(slots)
        assert cache.stats()["read_errors"] == 1
    finally:
        cache.close()


@pytest.mark.parametrize("threads", [1, 4])
def test_sector_offset_pieces_land_in_their_slots_with_no_copy(tmp_path, threads):
    """A GGUF's expert pieces start 32 bytes past a sector boundary: the slots' frames put
    each row at that lead (host_rows.py), so every piece's aligned span is read straight into
    its slot, none through the bounce buffer; the rows hold exactly the file's bytes, the
    frames' padding never leaks into a neighbour, and the piece that ends at the end of the
    file (its span reaching past it) reads whole."""
    lay, want = _layout(tmp_path / "f.bin", 3 * 4096, 3 * 4096, 32)
    end = max(int(pc.offsets.max()) + pc.nbytes for b in lay.banks.values() for pc in b.pieces)
    os.truncate(lay.paths[0], end)
    bounced = []
    real = direct.Bounce.get
    direct.Bounce.get = lambda self, n: (bounced.append(n), real(self, n))[1]
    cache = HostExpertCache(lay, 3, "lru", threads=threads, direct_io="on")
    try:
        for k in ("a", "b"):
            bank = cache.banks[k]
            assert bank.stride(0) > 3 * 4096 and bank[0].data_ptr() % 512 == 32, "rows not framed at the lead"
        _check_all(cache, want)
        cache.prefetch(np.arange(L * E))
        cache.drain()
        cache.check()
        _check_all(cache, want)
        assert not bounced, f"{len(bounced)} pieces went through the bounce buffer"
    finally:
        direct.Bounce.get = real
        cache.close()


@pytest.mark.parametrize("fault", ["truncated", "eio", "short"])
def test_framed_read_failures_are_clear_errors(tmp_path, monkeypatch, fault):
    """Reads straight into a slot's frame fail as clearly as the others: a file truncated
    under the reader, an EIO and a short count are an ExpertReadError for that expert only."""
    lay, want = _layout(tmp_path / "f.bin", 3 * 4096, 3 * 4096, 32)
    cache = HostExpertCache(lay, 3, "lru", threads=2, direct_io="on")
    try:
        assert cache.banks["a"][0].data_ptr() % 512 == 32
        bad = int(np.argmax(lay.banks["b"].pieces[0].offsets))          # the last piece in the file
        bad_off = int(lay.banks["b"].pieces[0].offsets[bad])
        if fault == "truncated":
            os.truncate(lay.paths[0], bad_off + 100)
        else:
            real = os.preadv

            def faulty(fd, bufs, off):          # the read that starts at the bad piece (a span
                if off <= bad_off < off + 4096:  # before it may reach into its first bytes)
                    if fault == "eio":
                        raise OSError(errno.EIO, "Input/output error")
                    return 100                   # a count short of a block: the file ended
                return real(fd, bufs, off)
            monkeypatch.setattr(os, "preadv", faulty)
            monkeypatch.setattr(c_reads, "ENABLED", False)  # (the C read's faults: test_disk_c_reads.py)
        msg = {"truncated": "truncated", "eio": "Input/output error", "short": "truncated"}[fault]
        with pytest.raises(ExpertReadError, match=f"expert {bad % E} of MoE layer {bad // E}.*{msg}|{msg}.*expert {bad % E} of MoE layer {bad // E}"):
            cache.acquire(np.array([bad]))
        cache.check()
        for f in (f for f in range(L * E) if f != bad):
            n, slots = cache.acquire(np.array([f]))
            assert np.array_equal(cache.banks["a"][slots[0]].numpy(), want[f]["a"])
            cache.release(slots)
    finally:
        cache.close()


def test_narrower_rows_read_into_the_slot_and_spread_out(tmp_path):
    """llama.cpp's Q4_K_M: one layer's rows narrower than the bank's (`pitch`): the packed
    piece is read into the slot's frame and each row moved out to the bank's pitch in place,
    the padding zeroed; the other layer's full-width rows land directly; none bounce."""
    rows, rb, pitch = 64, 96, 160
    n = L * E
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, 32 + n * rows * pitch + 512, dtype=np.uint8)
    path = tmp_path / "f.bin"
    path.write_bytes(data.tobytes())
    narrow = np.arange(n) < E                                  # layer 0: narrow rows, layer 1: full width
    off = 32 + np.arange(n, dtype=np.int64) * rows * pitch     # every piece 32 bytes past a sector
    files_n = np.where(narrow, 0, -1).astype(np.int32)
    files_w = np.where(narrow, -1, 0).astype(np.int32)
    pieces = [Piece(files_n, off, rows * rb, 0, rows=rows, pitch=pitch), Piece(files_w, off, rows * pitch, 0)]
    lay = DiskLayout([path], {"c": BankLayout(torch.uint8, (rows, pitch), pieces)}, L, E, ExpertSpec(8, 8))
    want = {}
    for f in range(n):
        if narrow[f]:
            w = np.zeros((rows, pitch), np.uint8)
            w[:, :rb] = data[off[f]:off[f] + rows * rb].reshape(rows, rb)
        else:
            w = data[off[f]:off[f] + rows * pitch].reshape(rows, pitch)
        want[f] = w
    bounced = []
    real = direct.Bounce.get
    direct.Bounce.get = lambda self, k: (bounced.append(k), real(self, k))[1]
    cache = HostExpertCache(lay, 2, "lru", threads=2, direct_io="on")
    try:
        for f in [*range(n), *range(n)]:                      # each slot holds narrow and wide rows in turn
            _, slots = cache.acquire(np.array([f]))
            assert np.array_equal(cache.banks["c"][slots[0]].numpy(), want[f]), f
            cache.release(slots)
        assert not bounced
    finally:
        direct.Bounce.get = real
        cache.close()


def test_a_4k_sector_disk_is_probed_and_still_read_in_place(tmp_path, monkeypatch):
    """A disk whose O_DIRECT reads need 4096-byte offsets, lengths and memory (emulated: any
    other direct read is refused with EINVAL, as the kernel does): the probe finds 4096, the
    frames follow it, and the pieces still land in their slots exactly, none bounced."""
    import fcntl
    real = os.preadv

    def sector_4k(fd, bufs, off):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            n = sum(len(b) for b in bufs)
            if off % 4096 or n % 4096 or any(direct.address(memoryview(b)) % 4096 for b in bufs):
                raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, bufs, off)

    monkeypatch.setattr(os, "preadv", sector_4k)
    monkeypatch.setattr(c_reads, "ENABLED", False)          # (the emulation is in `os.preadv`)
    lay, want = _layout(tmp_path / "f.bin", 3 * 4096, 3 * 4096, 32)
    bounced = []
    real_get = direct.Bounce.get
    monkeypatch.setattr(direct.Bounce, "get", lambda self, n: (bounced.append(n), real_get(self, n))[1])
    cache = HostExpertCache(lay, 3, "lru", threads=2, direct_io="on")
    try:
        assert cache.reader.aligns == [4096]
        assert cache.banks["a"].stride(0) % 4096 == 0 and cache.banks["a"][0].data_ptr() % 4096 == 32
        _check_all(cache, want)
        assert not bounced
    finally:
        cache.close()
