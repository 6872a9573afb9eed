"""FTW files: a round trip through `convert` rebuilds the same model (bit-exact banks,
identical logits) for every architecture and expert format; damaged files are refused with
one line naming the tensor."""
from __future__ import annotations

import struct

import pytest
import torch

from freetoken import LLM
from freetoken.cli import main as cli_main
from freetoken.errors import CheckpointError
from freetoken.weights.ftw import reader as ftw_reader
from freetoken.weights.ftw.format import ALIGN, MAGIC, PREAMBLE
from freetoken.weights.ftw.reader import FtwFile, read_header
from freetoken.loading.convert import convert

PROMPT = [5, 17, 3, 99, 42, 7, 250, 11, 64, 8, 300]

# (make-tiny arch, convert --expert-format, engine dtype)
CASES = [
    ("qwen3_moe", None, "float32"), ("qwen3_moe", "bf16", "bfloat16"), ("qwen3_moe", "int8", "float32"),
    ("qwen3_moe", "mxfp4", "float32"), ("qwen2_moe", None, "float32"), ("mixtral", "int8", "float32"),
    ("olmoe", None, "bfloat16"), ("qwen3_next", None, "float32"), ("qwen3_5_moe", "int8", "float32"),
    ("gpt_oss", None, "float32"), ("gpt_oss_mxfp4", None, "float32"), ("glm4_moe", "int8", "float32"),
    ("deepseek_v3", None, "float32"), ("deepseek_v32", "mxfp4", "float32"), ("glm_moe_dsa", None, "bfloat16"),
    ("deepseek_v4", "int8", "float32"), ("deepseek_v4_fp4", None, "float32"),
]


@pytest.mark.parametrize("arch,fmt,dtype", CASES, ids=[f"{a}-{f or 'native'}-{d}" for a, f, d in CASES])
def test_round_trip_identical_logits(tiny_dir, tmp_path, arch, fmt, dtype):
    check_round_trip(tiny_dir, tmp_path, arch, fmt, dtype, {})


# bf16 weights (the GEMM and dot choices apply), fp32 with hyper-connections, a hybrid
EVERY_CHOICE = [("qwen3_moe", "bf16", "bfloat16"), ("glm_moe_dsa", None, "bfloat16"),
                ("deepseek_v4", "int8", "float32"), ("qwen3_next", None, "float32")]


@pytest.mark.parametrize("arch,fmt,dtype", EVERY_CHOICE, ids=[f"{a}-{f or 'native'}-{d}" for a, f, d in EVERY_CHOICE])
def test_round_trip_identical_logits_under_every_choice(tiny_dir, tmp_path, cpu_choice, arch, fmt, dtype):
    check_round_trip(tiny_dir, tmp_path, arch, fmt, dtype, cpu_choice)


def check_round_trip(tiny_dir, tmp_path, arch, fmt, dtype, forced: dict):
    src = tiny_dir(arch)
    out = tmp_path / "m.ftw"
    convert(src, out, expert_format=fmt, dtype=dtype)
    opts = dict(dtype=dtype, expert_format=fmt, **forced)
    ref, got = LLM(str(src), **opts), LLM(str(out), **opts)
    for name, bank in ref.engine.model.pool.banks.items():
        other = got.engine.model.pool.banks[name]
        assert other.dtype == bank.dtype and torch.equal(other.view(torch.uint8), bank.view(torch.uint8)), name
    assert got.engine.model.pool.spec == ref.engine.model.pool.spec
    assert torch.equal(got.score(PROMPT), ref.score(PROMPT))
    assert got.tokenizer.encode("hello <think>") == ref.tokenizer.encode("hello <think>")
    assert got.tokenizer.chat_template == ref.tokenizer.chat_template
    assert got.tokenizer.eos_token_ids == ref.tokenizer.eos_token_ids


@pytest.fixture()
def ftw_file(tiny_dir, tmp_path):
    out = tmp_path / "m.ftw"
    convert(tiny_dir("qwen3_moe"), out, expert_format="int8")
    return out


def _entry(path, name):
    return next(t for t in read_header(path)["tensors"] if t["name"] == name)


def test_layout_aligned_and_described(ftw_file):
    h = read_header(ftw_file)
    assert h["format_version"] == 2 and h["options"]["expert_format"] == "int8"
    assert all(t["offset"] % ALIGN == 0 for t in h["tensors"])
    kinds = {t["kind"] for t in h["tensors"]}
    assert kinds == {"dense", "bank", "file"}
    assert ftw_file.stat().st_size % ALIGN == 0
    banks = {t["name"]: t for t in h["tensors"] if t["kind"] == "bank"}
    assert set(banks) == {"gate_up", "gate_up_scales", "down", "down_scales"}
    assert banks["gate_up"]["shape"][0] == h["experts"]["num_layers"] * h["experts"]["num_experts"]


@pytest.mark.parametrize("name", ["gate_up", "down_scales", "model.embed_tokens.weight", "tokenizer.json"])
def test_flipped_byte_names_the_tensor(ftw_file, name):
    e = _entry(ftw_file, name)
    data = bytearray(ftw_file.read_bytes())
    data[e["offset"] + e["nbytes"] // 2] ^= 0x40
    ftw_file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"checksum mismatch in tensor '{name}'"):
        FtwFile(ftw_file)
    FtwFile(ftw_file, verify=False)          # --verify off reads it without checking


def test_truncated_names_the_tensor(ftw_file):
    last = max(read_header(ftw_file)["tensors"], key=lambda t: t["offset"])
    with open(ftw_file, "r+b") as f:
        f.truncate(last["offset"] + 100)
    with pytest.raises(CheckpointError, match=f"truncated: tensor '{last['name']}'"):
        FtwFile(ftw_file)


def test_version_mismatch(ftw_file):
    data = bytearray(ftw_file.read_bytes())
    magic, _, z, size, digest = PREAMBLE.unpack(data[:PREAMBLE.size])
    data[:PREAMBLE.size] = PREAMBLE.pack(magic, 99, z, size, digest)
    ftw_file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="FTW format version 99, this FreeToken reads versions 1, 2"):
        FtwFile(ftw_file)


def test_corrupt_header_and_bad_magic(ftw_file):
    data = bytearray(ftw_file.read_bytes())
    data[PREAMBLE.size + 20] ^= 0x01
    ftw_file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="header checksum mismatch"):
        FtwFile(ftw_file)
    ftw_file.write_bytes(b"NOTFTW00" + bytes(data[8:]))
    with pytest.raises(CheckpointError):
        LLM(str(ftw_file))
    assert MAGIC == b"FREETOKW"


def test_expert_format_mismatch_is_one_line(ftw_file):
    with pytest.raises(CheckpointError, match="experts were converted to int8, not mxfp4"):
        LLM(str(ftw_file), expert_format="mxfp4")


def test_buffered_fallback_when_direct_read_refused(ftw_file, monkeypatch):
    want = FtwFile(ftw_file, direct=False, mapped=False).prebuilt_experts().banks
    real = ftw_reader.os.preadv
    refused = []

    def preadv(fd, bufs, off):
        if fd in direct_fds:
            refused.append(fd)
            raise OSError(22, "Invalid argument")
        return real(fd, bufs, off)

    direct_fds = set()
    real_open = ftw_reader.os.open

    def open_(path, flags, *a):
        fd = real_open(path, flags, *a)
        if flags & getattr(ftw_reader.os, "O_DIRECT", 0):
            direct_fds.add(fd)
        return fd

    monkeypatch.setattr(ftw_reader.os, "preadv", preadv)
    monkeypatch.setattr(ftw_reader.os, "open", open_)
    got = FtwFile(ftw_file, direct=True, mapped=False).prebuilt_experts().banks
    assert all(torch.equal(got[k].view(torch.uint8), want[k].view(torch.uint8)) for k in want)
    if hasattr(ftw_reader.os, "O_DIRECT") and direct_fds:
        assert refused


def test_cli_convert_generate_and_corrupt_exit_2(tiny_dir, tmp_path, capsys):
    src, out = tiny_dir("qwen3_moe"), tmp_path / "c.ftw"
    assert cli_main(["convert", "--model", str(src), "--out", str(out), "--expert-format", "int8"]) == 0
    args = ["generate", "--prompt", "hi", "--max-tokens", "5", "--temperature", "0", "--json",
            "--expert-format", "int8", "--dtype", "float32"]
    capsys.readouterr()
    assert cli_main(args + ["--model", str(src)]) == 0
    from_dir = capsys.readouterr().out
    assert cli_main(args + ["--model", str(out)]) == 0
    assert capsys.readouterr().out == from_dir
    e = _entry(out, "gate_up")
    data = bytearray(out.read_bytes())
    data[e["offset"] + 5] ^= 0xFF
    out.write_bytes(bytes(data))
    assert cli_main(args + ["--model", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'gate_up'" in err[0]
    assert cli_main(args + ["--model", str(out), "--verify", "off"]) == 0


def test_mapped_read_equals_read_and_never_writes_the_file(ftw_file):
    """The default copy-on-write mapping gives the same bytes as reading into buffers, and a
    write to a loaded tensor stays in the process (the file is unchanged)."""
    before = ftw_file.read_bytes()
    read = FtwFile(ftw_file, mapped=False)
    mapped = FtwFile(ftw_file)
    for e in mapped.entries:
        assert torch.equal(mapped._tensors[e.name].view(torch.uint8), read._tensors[e.name].view(torch.uint8)), e.name
    bank = mapped.prebuilt_experts().banks["gate_up"]
    bank.view(torch.uint8).fill_(0xAB)
    assert ftw_file.read_bytes() == before
    assert FtwFile(ftw_file).prebuilt_experts().banks["gate_up"].view(torch.uint8).ne(0xAB).any()


def test_mapping_unavailable_falls_back_to_reads(ftw_file, monkeypatch):
    from freetoken.weights.ftw import map as ftw_map
    want = FtwFile(ftw_file, mapped=False).prebuilt_experts().banks

    def refuse(self, offset, n):
        raise OSError(22, "madvise(MADV_POPULATE_READ): Invalid argument")

    monkeypatch.setattr(ftw_map.MappedFile, "populate", refuse)
    assert ftw_map.map_file(ftw_file, ftw_file.stat().st_size) is None
    got = FtwFile(ftw_file).prebuilt_experts().banks
    assert all(torch.equal(got[k].view(torch.uint8), want[k].view(torch.uint8)) for k in want)
