"""A re-read of an expert that already matched its checksum in this file version is not hashed
again (experts/disk/integrity.py `ExpertFileWatch.known`), forced both ways (`REHASH`): the
first read is hashed, a write to the file makes the next read of the same expert hashed again
and a mismatch is the usual clear error, a short read is an error either way; with `REHASH`
every read is hashed, and a change that sets the mtime back (the one thing a re-read without a
hash cannot see) is caught."""
from __future__ import annotations

import os

import pytest
import torch

from freetoken.experts.disk import host_cache, integrity
from freetoken.experts.disk.host_cache import ExpertReadError, ExpertReader
from freetoken.experts.disk.integrity import ExpertFileWatch, hash_file_experts, identity

from test_host_cache import _layout

OLD = 10**18          # an mtime in the past: a write now moves it whatever the clock's tick


@pytest.fixture
def counted(monkeypatch):
    n = {"hashes": 0}
    make = host_cache.xxh3_64

    def counting():
        n["hashes"] += 1
        return make()
    monkeypatch.setattr(host_cache, "xxh3_64", counting)
    return n


def _reader(tmp_path):
    lay, want = _layout(tmp_path / "f.bin")
    os.utime(lay.paths[0], ns=(OLD, OLD))
    watch = ExpertFileWatch(lay, hash_file_experts(lay), identity(lay.paths))
    return ExpertReader(lay, watch=watch, direct_io="off"), lay, want


def _read(reader, lay, flat):
    dst = {k: torch.zeros(b.row_shape, dtype=b.dtype) for k, b in lay.banks.items()}
    reader.read(flat, dst)
    return dst


def _rewrite_down(lay, want, flat, mtime=None):
    """Expert `flat`'s down piece overwritten in place with other bytes (mtime: set back to it)."""
    pc = lay.banks["down"].pieces[0]
    with open(lay.paths[0], "r+b") as f:
        f.seek(int(pc.offsets[flat]))
        f.write(bytes(255 - want[flat]["down"]))
    if mtime is not None:
        os.utime(lay.paths[0], ns=(mtime, mtime))


@pytest.mark.parametrize("rehash", [False, True])
def test_rereads_hash_once_per_file_version(tmp_path, monkeypatch, counted, rehash):
    monkeypatch.setattr(integrity, "REHASH", rehash)
    reader, lay, want = _reader(tmp_path)
    try:
        for _ in range(3):
            got = _read(reader, lay, 4)
            assert (got["down"].numpy() == want[4]["down"]).all()
        assert counted["hashes"] == (3 if rehash else 1)
        _rewrite_down(lay, want, 4)                  # the mtime moves: hashed again, and wrong
        with pytest.raises(ExpertReadError, match="does not match its checksum"):
            _read(reader, lay, 4)
        assert counted["hashes"] == (4 if rehash else 2)
    finally:
        reader.close()


@pytest.mark.parametrize("rehash", [False, True])
def test_a_change_under_the_same_identity_is_caught_only_by_rehash(tmp_path, monkeypatch, rehash):
    monkeypatch.setattr(integrity, "REHASH", rehash)
    reader, lay, want = _reader(tmp_path)
    try:
        _read(reader, lay, 2)
        _rewrite_down(lay, want, 2, mtime=OLD)       # bytes changed, identity set back on purpose
        if rehash:
            with pytest.raises(ExpertReadError, match="does not match its checksum"):
                _read(reader, lay, 2)
        else:                                        # the documented limit of hashing once
            assert not (_read(reader, lay, 2)["down"].numpy() == want[2]["down"]).all()
        _rewrite_down(lay, want, 5, mtime=OLD)
        with pytest.raises(ExpertReadError, match="does not match its checksum"):
            _read(reader, lay, 5)
    finally:
        reader.close()


def test_a_mismatch_makes_every_expert_hashed_again(tmp_path, counted):
    reader, lay, want = _reader(tmp_path)
    try:
        _read(reader, lay, 1)
        _rewrite_down(lay, want, 7, mtime=OLD)
        with pytest.raises(ExpertReadError):
            _read(reader, lay, 7)
        before = counted["hashes"]
        _read(reader, lay, 1)                        # matched before the mismatch: hashed again
        assert counted["hashes"] == before + 1
    finally:
        reader.close()


def test_a_short_reread_is_an_error_unhashed(tmp_path):
    reader, lay, want = _reader(tmp_path)
    try:
        last = max(range(len(want)), key=lambda f: int(lay.banks["down"].pieces[0].offsets[f]))
        _read(reader, lay, last)
        os.truncate(lay.paths[0], int(lay.banks["down"].pieces[0].offsets[last]) + 3)
        os.utime(lay.paths[0], ns=(OLD, OLD))
        with pytest.raises(ExpertReadError, match="truncated"):
            _read(reader, lay, last)
    finally:
        reader.close()
