"""A `.partial` left by an interrupted `convert` or `pull` is named as what it is, with the
command that finishes it (issue 36: it was "not an FTW, GGUF file or checkpoint directory")."""
from __future__ import annotations

import pytest

from freetoken.cli import main as cli_main
from freetoken.errors import CheckpointError
from freetoken.memory.model_size import read_model_shape
from freetoken.loading.convert import convert
from freetoken.weights.stores import resolve_model


@pytest.fixture(scope="module")
def half_converted(tiny_dir, tmp_path_factory):
    """What a SIGKILL mid-convert leaves: NAME.ftw.partial holding the first bytes, no NAME.ftw."""
    d = tmp_path_factory.mktemp("partial")
    whole = d / "whole.ftw"
    convert(str(tiny_dir("qwen3_moe")), str(whole))
    data = whole.read_bytes()
    partial = d / "m.ftw.partial"
    partial.write_bytes(data[: len(data) // 2])
    return partial


def test_partial_ftw_is_an_incomplete_conversion(half_converted):
    for spec in (half_converted, half_converted.with_name("m.ftw")):   # the .partial, or the name it was to get
        with pytest.raises(CheckpointError, match="incomplete conversion.*run convert again"):
            resolve_model(str(spec))
    with pytest.raises(CheckpointError, match="incomplete conversion"):
        read_model_shape(half_converted)


@pytest.mark.parametrize("verb", ["generate", "plan"])
def test_cli_names_the_incomplete_conversion_in_one_line(half_converted, capsys, verb):
    args = [verb, "--model", str(half_converted)] + (["--prompt", "hi", "--max-tokens", "1"] if verb == "generate" else [])
    assert cli_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "incomplete conversion" in err[0] and "run convert again" in err[0], err


def test_partial_download_names_pull(tmp_path):
    p = tmp_path / "model-Q4_K_M.gguf.partial"
    p.write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(CheckpointError, match="incomplete download.*pull"):
        resolve_model(str(p))
