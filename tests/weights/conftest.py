"""Fixture: GGUF files made from tiny HF checkpoints by llama.cpp's own converter."""
from __future__ import annotations

import pytest

from llamacpp import Unavailable, convert, llama_cpp_source


@pytest.fixture(scope="session")
def to_gguf(tmp_path_factory):
    """to_gguf(model_dir, outtype="f32", *extra converter args) -> a GGUF made by llama.cpp's converter."""
    try:
        src = llama_cpp_source()
    except Unavailable as e:
        pytest.skip(str(e))
    out_root = tmp_path_factory.mktemp("gguf")
    made: dict = {}

    def get(model_dir, outtype: str = "f32", *extra: str):
        key = (str(model_dir), outtype, extra)
        if key not in made:
            made[key] = convert(src, model_dir, out_root / f"{len(made)}-{outtype}.gguf", outtype, *extra)
        return made[key]

    return get
