"""The FTW background load (weights/ftw/load.py): tensors split into many pieces and read units are
reassembled and verified exactly; a corrupt piece anywhere is named whether the caller waits
per tensor or for the whole file; the threads are gone after the load or when it is abandoned."""
from __future__ import annotations

import threading

import pytest
import torch

from freetoken import LLM
from freetoken.errors import CheckpointError
from freetoken.weights.ftw import format as ftw_format, load as ftw_load, writer as ftw_writer
from freetoken.weights.ftw.reader import FtwFile, read_header
from freetoken.loading.convert import convert


def _flip(path, name, where=0.5):
    e = next(t for t in read_header(path)["tensors"] if t["name"] == name)
    data = bytearray(path.read_bytes())
    data[e["offset"] + int(e["nbytes"] * where)] ^= 0x10
    path.write_bytes(bytes(data))


def _load_threads():
    return [t for t in threading.enumerate() if t.name.startswith(("ftw-read", "ftw-verify"))]


@pytest.fixture()
def small_pieces(monkeypatch):
    """4 KiB pieces, 3 per read: every bank spans many pieces and read units, some partial."""
    for mod in (ftw_format, ftw_writer, ftw_load):
        monkeypatch.setattr(mod, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(ftw_load, "PIECES_PER_READ", 3)


@pytest.fixture()
def ftw_file(tiny_dir, tmp_path):
    out = tmp_path / "m.ftw"
    convert(tiny_dir("qwen3_moe"), out, expert_format="int8")
    return out


@pytest.mark.parametrize("mapped", [True, False])
def test_many_pieces_read_back_exactly_and_corruption_named(tiny_dir, tmp_path, small_pieces, mapped):
    out = tmp_path / "m.ftw"
    convert(tiny_dir("qwen3_moe"), out, expert_format="int8")
    h = read_header(out)
    assert max(t["nbytes"] for t in h["tensors"]) > 10 * 4096
    got = FtwFile(out, mapped=mapped)
    raw = out.read_bytes()
    for e in got.entries:
        assert got._tensors[e.name].view(torch.uint8).flatten().numpy().tobytes() == raw[e.offset:e.offset + e.nbytes]
    for where in (0.0, 0.37, 0.999):
        _flip(out, "gate_up", where)
        with pytest.raises(CheckpointError, match="checksum mismatch in tensor 'gate_up'"):
            FtwFile(out, mapped=mapped)
        _flip(out, "gate_up", where)             # flipped back: reads clean again
        FtwFile(out, mapped=mapped)
    assert not _load_threads()


def test_background_get_serves_clean_tensors_and_close_verifies_the_rest(ftw_file, monkeypatch):
    _flip(ftw_file, "down")
    gate = threading.Event()
    read = ftw_load.TensorLoad._read

    def held_read(self, e, a, n):            # 'down' is read only once the caller has its tensor
        if e.name == "down":
            gate.wait(10)
        read(self, e, a, n)

    monkeypatch.setattr(ftw_load.TensorLoad, "_read", held_read)
    f = FtwFile(ftw_file, background=True)
    emb = f.get("model.embed_tokens.weight")
    assert emb.shape[0] == f.config["vocab_size"]
    gate.set()
    with pytest.raises(CheckpointError, match="checksum mismatch in tensor 'down'"):
        f.close()
    with pytest.raises(CheckpointError, match="'down'"):    # and any later use says so again
        f.get("model.embed_tokens.weight")
    assert not _load_threads()


def test_abandon_stops_the_reads(ftw_file):
    f = FtwFile(ftw_file, background=True)
    f.abandon()
    assert not _load_threads()
    with pytest.raises(CheckpointError):
        f.close()


def test_engine_refuses_a_corrupt_bank_before_running(ftw_file):
    """The model is built while the banks are read; the engine still fails before any step."""
    _flip(ftw_file, "gate_up_scales")
    with pytest.raises(CheckpointError, match="checksum mismatch in tensor 'gate_up_scales'"):
        LLM(str(ftw_file), dtype="float32", expert_format="int8")
    assert not _load_threads()
