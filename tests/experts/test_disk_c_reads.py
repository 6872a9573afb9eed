"""The C read of one expert (experts/disk/c_reads.py, kernels/c/expert_read.c) against the Python
path it replaces (host_cache.ExpertReader.read into the slot's frames), on every kernel build:
the same bytes in every slot's whole frame (rows, spread narrow rows, zeroed padding, the span's
head and tail), the same xxh3 digest over the same bytes, on drawn layouts (hypothesis); a file
that ends inside a piece is the same "truncated" error, a failed read the OSError it was, and a
checksum mismatch read by C is the cache's usual clear error, the cache serving on."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import xxhash
from hypothesis import given, settings, strategies as st

from freetoken.experts.disk import c_reads
from freetoken.experts.disk.host_cache import ExpertReadError, ExpertReader, HostExpertCache, _SlotRows
from freetoken.experts.disk.host_rows import HostRows, frame_of
from freetoken.experts.disk.integrity import ExpertFileWatch, hash_file_experts, identity
from freetoken.experts.disk.pieces import BankLayout, DiskLayout, Piece
from freetoken.experts.memory.pool import ExpertSpec
from freetoken.kernels import load, variants_here

L, E = 2, 3


def _layout(path: Path, rows: int, rb: int, pitch: int, lead: int, gap: int, seed: int):
    """Two banks an expert: "c" of `rows` rows, `pitch` wide in the bank, layer 0's experts
    stored narrow (`rb` bytes a row, spread on read), layer 1's full width; "d" one flat piece.
    Every piece `lead` bytes past a 512-byte boundary (a GGUF's 32), `gap` sectors apart."""
    n = L * E
    rng = np.random.default_rng(seed)
    sizes = [rows * pitch, rows * pitch]
    room = -(-(lead + max(sizes)) // 512) * 512 + 512 * gap
    data = rng.integers(0, 256, 2 * n * room + 8192, dtype=np.uint8)     # (>= 8 KiB: the 512-byte probe)
    path.write_bytes(data.tobytes())
    order = rng.permutation(2 * n).reshape(2, n)
    off = lead + order.astype(np.int64) * room
    narrow = np.arange(n) < E
    c = [Piece(np.where(narrow, 0, -1).astype(np.int32), off[0], rows * rb, 0, rows=rows, pitch=pitch),
         Piece(np.where(narrow, -1, 0).astype(np.int32), off[0], rows * pitch, 0)]
    d = [Piece(np.zeros(n, np.int32), off[1], rows * pitch, 0)]
    return DiskLayout([path], {"c": BankLayout(torch.uint8, (rows, pitch), c),
                               "d": BankLayout(torch.uint8, (rows * pitch,), d)}, L, E, ExpertSpec(8, 8))


def _frames(reader: ExpertReader, lay: DiskLayout, slots: int) -> dict:
    align = max((a for a, fd in zip(reader.aligns, reader.dfds) if fd is not None), default=1)
    rows = {k: HostRows(slots, b.row_shape, b.dtype, *frame_of(b, align)) for k, b in lay.banks.items()}
    for r in rows.values():               # padding not zero to begin with: what a read leaves shows
        np.frombuffer(r._mm, np.uint8)[:] = 0xA5
    return rows


class _Digests:
    """A file watch that hashes every read and keeps the digests it is shown (none is wrong)."""

    def __init__(self):
        self.seen = []

    def known(self, flat, fds):
        return False

    def check(self, flat, digest):
        self.seen.append(digest)


def _read_one(reader: ExpertReader, rows: dict, flat: int, slot: int, use_c: bool) -> bool:
    """Expert `flat` into `slot` by the C read (`use_c`, where it takes it) or the Python path;
    whether C read it."""
    reader.read(flat, _SlotRows({k: r.bank for k, r in rows.items()}, slot),
                {k: (r.frame(slot), r.lead) for k, r in rows.items()}, slot if use_c else None)
    return use_c and bool(reader.plan.ok[flat])


def _read_both(lay: DiskLayout, flats, variant: str):
    """Each of `flats` read into its slot by the C read and by the Python path (two readers, two
    sets of frames): (C frames' bytes, Python frames' bytes, C digests, Python digests, C-read count)."""
    out = []
    for use_c in (True, False):
        watch = _Digests()
        reader = ExpertReader(lay, watch=watch, direct_io="on")
        try:
            rows = _frames(reader, lay, len(flats))
            reader.frame(rows)
            reader.plan.lib = load(variant)
            taken = sum(_read_one(reader, rows, f, slot, use_c) for slot, f in enumerate(flats))
            out.append(({k: bytes(r._mm) for k, r in rows.items()}, watch.seen, taken))
        finally:
            reader.close()
    (fc, dc, taken), (fp, dp, _) = out
    return fc, fp, dc, dp, taken


@pytest.fixture(scope="module")
def direct_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("c_reads")
    try:
        ExpertReader(_layout(d / "probe.bin", 4, 96, 160, 32, 1, 0), direct_io="on").close()
    except OSError:
        pytest.skip("O_DIRECT refused on this filesystem")
    return d


@pytest.mark.parametrize("variant", variants_here())
def test_c_read_is_the_python_read(direct_dir, variant):
    lay = _layout(direct_dir / "a.bin", 64, 96, 160, 32, 1, 1)
    flats = [0, 4, 1, 5, 2, 3]            # narrow and wide rows in turn
    fc, fp, dc, dp, taken = _read_both(lay, flats, variant)
    assert taken == len(flats), "the C read did not take framed experts"
    assert fc == fp and dc == dp
    for slot, f in enumerate(flats):      # and digests of the file's own bytes
        data = lay.paths[0].read_bytes()
        want = xxhash.xxh3_64()
        for b in lay.banks.values():
            for pc in b.pieces:
                if pc.files[f] >= 0:
                    want.update(data[pc.offsets[f]:pc.offsets[f] + pc.nbytes])
        assert dc[slot] == want.intdigest()


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 40), rb=st.integers(1, 300), extra=st.integers(0, 200), lead=st.sampled_from([0, 32, 100, 511]),
       gap=st.integers(0, 3), seed=st.integers(0, 99), flats=st.lists(st.integers(0, L * E - 1), min_size=1, max_size=8))
def test_drawn_layouts_read_the_same(direct_dir, rows, rb, extra, lead, gap, seed, flats):
    lay = _layout(direct_dir / "h.bin", rows, rb, rb + extra, lead, gap, seed)
    fc, fp, dc, dp, taken = _read_both(lay, flats, variants_here()[0])
    assert fc == fp and dc == dp
    assert taken == len(flats)        # (every piece 512-aligned but its lead: all framed)


@pytest.mark.parametrize("variant", variants_here())
def test_truncated_and_failed_reads(direct_dir, variant):
    lay = _layout(direct_dir / "t.bin", 64, 96, 160, 32, 1, 2)
    ends = {f: max(int(pc.offsets[f]) + pc.nbytes for b in lay.banks.values() for pc in b.pieces if pc.files[f] >= 0)
            for f in range(L * E)}
    lost = max(ends, key=ends.get)
    os.truncate(lay.paths[0], ends[lost] - 1)
    errors = []
    for use_c in (True, False):
        reader = ExpertReader(lay, direct_io="on")
        rows = _frames(reader, lay, 1)
        reader.frame(rows)
        reader.plan.lib = load(variant)
        try:
            assert not use_c or reader.plan.ok[lost], "the C read does not take the expert"
            with pytest.raises(ExpertReadError, match=f"truncated: expert {lost % E} of MoE layer {lost // E}") as e:
                _read_one(reader, rows, lost, 0, use_c)
            errors.append(str(e.value))
            if use_c:                      # a read that fails in the kernel: its errno, as preadv raises
                os.close(reader.dfds[0])
                with pytest.raises(OSError, match="Bad file descriptor"):
                    _read_one(reader, rows, 0, 0, True)
                reader.dfds[0] = os.open(lay.paths[0], os.O_RDONLY)     # (for close)
        finally:
            reader.close()
    assert errors[0] == errors[1]


def test_a_checksum_mismatch_read_by_c_is_a_clear_error(direct_dir):
    lay = _layout(direct_dir / "m.bin", 64, 96, 160, 32, 1, 3)
    os.utime(lay.paths[0], ns=(10**18, 10**18))
    watch = ExpertFileWatch(lay, hash_file_experts(lay), identity(lay.paths))
    watch.digests[4] ^= 1                               # expert 4's checksum is not its bytes'
    cache = HostExpertCache(lay, 2, "lru", threads=1, watch=watch, direct_io="on")
    try:
        assert cache.reader.plan.ok[4], "the C read does not take the expert"
        with pytest.raises(ExpertReadError, match="expert 1 of MoE layer 1 does not match its checksum"):
            cache.acquire(np.array([4]))
        cache.check()
        n, slots = cache.acquire(np.array([0]))             # the others serve on
        cache.release(slots)
        assert cache.stats()["read_errors"] == 1
    finally:
        cache.close()
