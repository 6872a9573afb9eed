"""A file given as a model that is not one says what it is, with its absolute path."""
from __future__ import annotations

import os

import pytest

from freetoken.errors import CheckpointError
from freetoken.memory.model_size import read_model_shape

CASES = {
    "lfs": (b"version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 98362432\n", "git lfs pull"),
    "html": (b"<!DOCTYPE html>\n<html><head><title>Hugging Face</title></head></html>", "HTML page"),
    "text": (b"just some notes\n", "a text file"),
    "empty": (b"", "empty file"),
    "binary": (b"\x00\x01\x02\x03garbage", "starts with bytes 00 01 02 03"),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_not_a_model_file_says_what_it_is(tmp_path, monkeypatch, kind):
    data, says = CASES[kind]
    (tmp_path / "m.gguf").write_bytes(data)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError) as e:
        read_model_shape("m.gguf")
    msg = str(e.value)
    assert says in msg and msg.startswith(os.path.join(str(tmp_path), "m.gguf")), msg
